"""The REST server's protocol limits: request body size, header and body deadlines, open connections.

Connections. uvicorn alone keeps a connection that sends nothing, or half its headers, open
forever, until the process runs out of file descriptors and accept() fails for everyone. Here a
connection must complete each request's headers within `header_timeout_s` (from its opening, or
from the first byte of a keep-alive request) and its body within `body_timeout_s`, or it is
closed; an idle keep-alive connection is closed after `keep_alive_s`. At most `max_connections`
are open (by default what the open-file limit leaves room for): one more closes the connection
that has waited longest for a request, or, when every connection is in the middle of one, is
answered 503 and closed.

Bodies. The body limit defaults to a full batch of the model's inputs written as JSON text
(body_limit): larger is refused with 413, from Content-Length before reading it when it is given.

These live apart from the app (artifacts/server.py) because they guard the transport, below
routing: GuardedProtocol acts on connections before any request reaches the app.
"""

from __future__ import annotations

import asyncio
import math
import os
import resource
from collections import Counter
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from temper.artifacts.bundle import ServingConfig

MAX_BODY_BYTES = 64 * 1024 * 1024  # the body limit when a dynamic non-batch dim leaves the size unknown
MIN_BODY_BYTES = 1024 * 1024
JSON_BYTES_PER_ELEMENT = 32  # the longest JSON number (-2.2250738585072014e-308, 24 chars), a separator, brackets

HEADER_TIMEOUT_S = 5.0
BODY_TIMEOUT_S = 60.0
KEEP_ALIVE_S = 5
MAX_CONNECTIONS = 4096  # the default's ceiling, when the open-file limit allows more
FD_RESERVE = 64  # file descriptors kept free for the model, logs and the listening socket
TOO_MANY_CONNECTIONS = b'{"error":"too many connections, all of them busy; try again shortly"}'
REFUSED = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\n"
           b"content-length: %d\r\n\r\n%s" % (len(TOO_MANY_CONNECTIONS), TOO_MANY_CONNECTIONS))


def body_limit(config: ServingConfig) -> int:
    """The default request body limit: a full batch of every input written as JSON text, the
    largest form a valid request takes (binary tensor data is 3-30x smaller), at least
    MIN_BODY_BYTES. MAX_BODY_BYTES when an input has a dynamic non-batch dim (a sequence
    length): the model does not bound the size then."""
    fixed = [s.shape[s.batch_axis] for s in config.inputs if s.batch_axis is not None and s.shape[s.batch_axis] > 0]
    rows = min([config.max_batch_size, *fixed])
    other = {s.name: [d for axis, d in enumerate(s.shape) if axis != s.batch_axis] for s in config.inputs}
    if any(d < 0 for dims in other.values() for d in dims):
        return MAX_BODY_BYTES
    batched = sum(math.prod(other[s.name]) for s in config.inputs if s.batch_axis is not None)
    once = sum(math.prod(other[s.name]) for s in config.inputs if s.batch_axis is None)  # a constant: not per row
    return max(MIN_BODY_BYTES, (rows * batched + once) * JSON_BYTES_PER_ELEMENT)


def connection_limit() -> int:
    """The most connections the open-file limit leaves room for, beside the descriptors already
    open and FD_RESERVE, capped at MAX_CONNECTIONS: at the limit the server makes room itself,
    instead of accept() failing with EMFILE for every client."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS
    return max(1, min(MAX_CONNECTIONS, soft - len(os.listdir("/dev/fd")) - FD_RESERVE))


class Connections:
    """The open connections and, in the order they began waiting, those waiting for a request.
    Event loop only."""

    def __init__(self, limit: int, header_timeout_s: float, body_timeout_s: float) -> None:
        self.limit = limit
        self.timeouts = {"header_timeout": header_timeout_s, "body_timeout": body_timeout_s}
        self.open = 0
        self.waiting: dict[GuardedProtocol, None] = {}  # insertion order: longest waiting first
        self.closed: Counter[str] = Counter()  # connections this server closed, by reason

    def opened(self, connection: GuardedProtocol) -> bool:
        """Count a new connection; over the limit, close the longest waiting one, or say (False)
        that this one must be refused because every other is busy with a request."""
        self.open += 1
        if self.open > self.limit:
            if not self.waiting:
                self.closed["refused"] += 1
                return False
            oldest = next(iter(self.waiting))
            del self.waiting[oldest]
            self.closed["evicted"] += 1
            oldest.transport.close()
        self.waiting[connection] = None
        return True

    def busy(self, connection: GuardedProtocol) -> None:
        """`connection` is in the middle of a request: not one to evict."""
        self.waiting.pop(connection, None)

    def idle(self, connection: GuardedProtocol) -> None:
        """`connection` waits for its next request, the newest to do so."""
        self.waiting.pop(connection, None)
        self.waiting[connection] = None

    def lost(self, connection: GuardedProtocol) -> None:
        self.open -= 1
        self.waiting.pop(connection, None)


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol plus what it lacks: deadlines for a request's headers and body,
    and the connection limit. uvicorn's own keep-alive timer closes idle keep-alive connections.

    A deadline is armed only when a read ends part-way through a request, so a request that
    arrives whole in one read (nearly all) sets no timer at all.
    """

    def __init__(self, *args: Any, connections: Connections, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.guard = connections
        self.reading: str | None = None  # what the request being read would be late with: its headers or body
        self.deadline: asyncio.TimerHandle | None = None
        self.deadline_for: str | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if self.guard.opened(self):
            self._arm("header_timeout")  # a new connection owes its first request's headers from now
        else:
            transport.write(REFUSED)
            transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self.guard.lost(self)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.reading is not None and self.reading != self.deadline_for and not self.transport.is_closing():
            self._arm(self.reading)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.reading = "header_timeout"

    def on_headers_complete(self) -> None:
        self.guard.busy(self)
        self.reading = "body_timeout"
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self.reading = None
        self._disarm()
        super().on_message_complete()

    def on_response_complete(self) -> None:
        pipelined = bool(self.pipeline)
        super().on_response_complete()
        if not pipelined and not self.transport.is_closing():
            self.guard.idle(self)

    def _arm(self, reason: str) -> None:
        self._disarm()
        self.deadline = self.loop.call_later(self.guard.timeouts[reason], self._expire, reason)
        self.deadline_for = reason

    def _disarm(self) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = self.deadline_for = None

    def _expire(self, reason: str) -> None:
        self.deadline = self.deadline_for = None
        if not self.transport.is_closing():
            self.guard.closed[reason] += 1
            self.transport.close()
