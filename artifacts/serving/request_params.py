"""The inference request parameters both servers read, and the ones they refuse: one rule for REST and gRPC.

Triton's names and units: `timeout` is the request's queue timeout in microseconds (its
default_queue_policy with allow_timeout_override), `priority` a priority level (0: the default).
temper has one queue and no priority levels, so it honours `timeout` (never past the bundle's
timeout_s) and refuses a priority other than 0. It refuses, in one line, what it would otherwise
ignore: an output's `class_count` or `classification` (Triton's classification extension). Shared-memory parameters are
artifacts/serving/client_shm.py's.
"""

from __future__ import annotations

from collections.abc import Mapping

from temper.artifacts.core.errors import RequestError


def queue_timeout_s(params: object, default_s: float) -> float | None:
    """The request's queue timeout in seconds (None: the bundle's default_s); RequestError for a bad
    `timeout` or a `priority` other than 0."""
    if not isinstance(params, Mapping):
        return None
    priority = params.get("priority", 0)
    if type(priority) is not int or priority < 0:
        raise RequestError(f"parameters.priority must be a non-negative integer, got {priority!r}")
    if priority:
        raise RequestError(f"parameters.priority {priority}: this server has one queue and no priority levels; "
                           "send priority 0 or leave it out")
    timeout = params.get("timeout")
    if timeout is None:
        return None
    if type(timeout) is not int or timeout < 0:
        raise RequestError(f"parameters.timeout must be a non-negative integer of microseconds, got {timeout!r}")
    return min(timeout / 1e6, default_s) if timeout else None  # 0: the default, as in Triton


# Triton's classification extension, as its protocol document names it (class_count) and as tritonclient's
# InferRequestedOutput(class_count=N) sends it (classification), over REST and gRPC alike
CLASSIFICATION = ("class_count", "classification")


def check_output(name: str, params: object) -> None:
    """RequestError for an output that asks for classification (class_count, or tritonclient's classification)."""
    if not isinstance(params, Mapping):
        return
    for key in CLASSIFICATION:
        if params.get(key, 0) not in (0, None):
            raise RequestError(f"output '{name}': {key} (Triton's classification extension) is not supported; "
                               "ask for the output without it and take the top classes from it")
