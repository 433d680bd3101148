"""Why a request was not answered, as exceptions both servers map to their own status codes.

They live apart from the Runtime so that the batcher, the REST server and the gRPC server name
the same classes without importing each other; each class says which status it becomes.
"""

from __future__ import annotations


class RequestError(ValueError):
    """Bad request (HTTP 400, gRPC INVALID_ARGUMENT): the message says what is wrong."""


class Overloaded(RuntimeError):
    """Queue full (HTTP 503, gRPC RESOURCE_EXHAUSTED)."""


class RequestTimeout(TimeoutError):
    """Not answered within config.timeout_s (HTTP 504, gRPC DEADLINE_EXCEEDED)."""


class Stopped(RuntimeError):
    """The runtime was stopped (HTTP 503, gRPC UNAVAILABLE): a request submitted afterwards, or
    still queued when it stopped, fails with this at once instead of waiting for a batcher that
    no longer runs."""
