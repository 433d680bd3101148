"""The REST server's protocol limits: request body size, header and body deadlines, open connections.

Connections. uvicorn alone keeps a connection that sends nothing, or half its headers, open
forever, until the process runs out of file descriptors and accept() fails for everyone. Here a
connection must complete each request's headers within `header_timeout_s` (from its opening, or
from the first byte of a keep-alive request) and its body within `body_timeout_s`, or it is
closed; an idle keep-alive connection is closed after `keep_alive_s`. At most `max_connections`
are open (by default what the open-file limit leaves room for): one more closes the connection
that has waited longest for a request, or, when every connection is in the middle of one, is
answered 503 and closed.

Headers. uvicorn (httptools) takes headers of any size and number: a 37 MiB header value was
answered 200, and four connections of many small headers took the server from 221 to 621 MiB. Here
a request's line and headers together may hold at most MAX_HEADER_BYTES, and at most MAX_HEADERS
header fields (Apache's default count); more is answered 431 and the connection closed, after
reading on briefly (LINGER_S) so that the client reads the answer instead of a reset.

Bodies. The body limit defaults to a full batch of the model's inputs written as JSON text
(body_limit): larger is refused with 413, from Content-Length before reading it when it is given.

These live apart from the app (artifacts/serving/server.py) because they guard the transport, below
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

from temper.artifacts.formats.bundle import ServingConfig

MAX_BODY_BYTES = 64 * 1024 * 1024  # the body limit when a dynamic non-batch dim leaves the size unknown
MIN_BODY_BYTES = 1024 * 1024
JSON_BYTES_PER_ELEMENT = 32  # the longest JSON number (-2.2250738585072014e-308, 24 chars), a separator, brackets

HEADER_TIMEOUT_S = 5.0
BODY_TIMEOUT_S = 60.0
KEEP_ALIVE_S = 5
MAX_CONNECTIONS = 4096  # the default's ceiling, when the open-file limit allows more
FD_RESERVE = 64  # file descriptors kept free for the model, logs and the listening socket
TOO_MANY_CONNECTIONS = b'{"error":"too many connections, all of them busy; try again shortly"}'
MAX_HEADER_BYTES = 64 * 1024  # the request line and every header field together
MAX_HEADERS = 100
LINGER_S = 1.0  # after a 431: read and drop what the client still sends, then close
REFUSED = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\n"
           b"content-length: %d\r\n\r\n%s" % (len(TOO_MANY_CONNECTIONS), TOO_MANY_CONNECTIONS))


def _too_large(message: str) -> bytes:
    body = b'{"error":"%s"}' % message.encode()
    return (b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
            b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))


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
        self.timeouts = {"header_timeout": header_timeout_s, "body_timeout": body_timeout_s, "linger": LINGER_S}
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

    Header size is counted twice: exactly, field by field, as httptools hands each one over; and
    by the reads that go on while a field is still unfinished (httptools keeps an unfinished field
    to itself, growing), which leaves at most one read uncounted.
    """

    def __init__(self, *args: Any, connections: Connections, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.guard = connections
        self.reading: str | None = None  # what the request being read would be late with: its headers or body
        self.deadline: asyncio.TimerHandle | None = None
        self.deadline_for: str | None = None
        self.header_bytes = 0  # of the request being read: its line and the header fields handed over so far
        self.header_fields = 0
        self.header_reads = 0  # bytes of the reads that began and ended inside this request's headers
        self.too_large: str | None = None  # why the request's headers are refused, once they are

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
        if self.too_large is not None:
            return  # answered 431: what still comes is dropped until the linger timer closes
        continuing = self.reading == "header_timeout"
        super().data_received(data)
        if continuing and self.reading == "header_timeout" and self.too_large is None:
            self.header_reads += len(data)
            if self.header_reads > MAX_HEADER_BYTES:
                self._headers_over(f"request headers are over the limit of {MAX_HEADER_BYTES:,} bytes")
        if self.too_large is not None:
            self._refuse_headers()
            return
        if self.reading is not None and self.reading != self.deadline_for and not self.transport.is_closing():
            self._arm(self.reading)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.reading = "header_timeout"
        self.header_bytes = self.header_fields = self.header_reads = 0

    def on_url(self, url: bytes) -> None:
        self.header_bytes += len(url)
        if self.header_bytes > MAX_HEADER_BYTES:
            self._headers_over(f"request line and headers are over the limit of {MAX_HEADER_BYTES:,} bytes")
        if self.too_large is None:
            super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self.header_fields += 1
        self.header_bytes += len(name) + len(value) + 4  # ": " and CRLF
        if self.header_fields > MAX_HEADERS:
            self._headers_over(f"more than {MAX_HEADERS} header fields")
        elif self.header_bytes > MAX_HEADER_BYTES:
            self._headers_over(f"request headers are over the limit of {MAX_HEADER_BYTES:,} bytes")
        if self.too_large is None:
            super().on_header(name, value)

    def on_headers_complete(self) -> None:
        if self.too_large is not None:
            return  # refused: no request reaches the app
        self.guard.busy(self)
        self.reading = "body_timeout"
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if self.too_large is None:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self.too_large is not None:
            return
        self.reading = None
        self._disarm()
        super().on_message_complete()

    def on_response_complete(self) -> None:
        pipelined = bool(self.pipeline)
        super().on_response_complete()
        if not pipelined and not self.transport.is_closing():
            self.guard.idle(self)

    def _headers_over(self, message: str) -> None:
        if self.too_large is None:
            self.too_large = message

    def _refuse_headers(self) -> None:
        """Answer 431, stop writing, and close once the client has had LINGER_S to read it."""
        self.guard.closed["headers_too_large"] += 1
        self.reading = None
        self.transport.write(_too_large(self.too_large or ""))
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self._arm("linger")

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
            if reason != "linger":  # counted already, as headers_too_large
                self.guard.closed[reason] += 1
            self.transport.close()
