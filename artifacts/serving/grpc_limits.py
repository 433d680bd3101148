"""The gRPC server's protocol limits: a receive deadline for every call, a bound on the calls waiting for
their message, streams per connection, idle connections, dead peers and slow handshakes.

grpcio's synchronous server hands an RPC to a pool thread as soon as its headers arrive, and that
thread then waits, with no deadline, for the request message. A client that sends headers and
never the message (272 such ModelInfer calls on main, 17 with max_queue 1) held every pool thread
and every slot of `maximum_concurrent_rpcs`, so every other client got RESOURCE_EXHAUSTED with an
empty queue. Halving the streams one connection may open did not help over 2-4 connections, and
refused a normal client's calls past half the slots on one connection (REFUSED_STREAM, UNAVAILABLE),
none of them counted. Here:

  ReceiveDeadline  an interceptor that serves each unary RPC as a client-streaming one, so that the
                   handler holds the call while it waits for the message; one watchdog thread
                   cancels the call when the message has not arrived within `receive_timeout_s`
                   of its headers, and a call that arrives while `most_waiting` others wait for
                   theirs cancels the one that has waited longest (a normal call waits microseconds,
                   so that is a silent one); both free the thread and are counted (`late`)
  pool_size()      the threads: what the models hold in flight plus the calls allowed to wait for
                   their message, so silent calls never take the threads normal calls need. grpcio's
                   `maximum_concurrent_rpcs` is not set: calls past the threads wait in the pool's
                   queue, as Triton's calls queue, and the models' own queue refuses what it cannot
                   hold (UNAVAILABLE "Exceeds maximum queue size", counted REJECTED)
  options()        streams per connection: STREAMS_PER_SLOT times what the models hold, so a normal
                   client's burst on one connection meets the models' queue, not HTTP/2's refusal;
                   connections with no call for `idle_s` closed (GOAWAY; clients reconnect on the
                   next call), peers that do not answer a keepalive ping closed, and connections
                   that do not finish the HTTP/2 handshake within HANDSHAKE_TIMEOUT_S closed.
  Unparsable       bytes that are not the RPC's message answer INVALID_ARGUMENT (the client's mistake), not
                   grpcio's INTERNAL.
ModelStreamInfer's limits (streams open at once, requests per stream) are artifacts/serving/grpc_stream.py's.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import grpc

RECEIVE_TIMEOUT_S = 10.0  # a 64 MiB message at 100 Mbit/s takes about 5.4 s
IDLE_S = 60.0
KEEPALIVE_S = 60.0
KEEPALIVE_TIMEOUT_S = 20.0
HANDSHAKE_TIMEOUT_S = 5.0  # as the REST server's header timeout
TICK_S = 0.1


STREAMS_PER_SLOT = 4  # streams one connection may open, per call the models hold in flight
WAITING_PER_SLOT = 3  # calls that may wait for their message at once, per call the models hold in flight


def most_waiting(in_flight: int) -> int:
    """How many calls may wait for their request message at once, for models that hold `in_flight` calls."""
    return WAITING_PER_SLOT * in_flight


def pool_size(in_flight: int) -> int:
    """Threads for a server whose models hold `in_flight` calls: those, and the calls waiting for their message."""
    return in_flight + most_waiting(in_flight)


def options(in_flight: int, idle_s: float = IDLE_S) -> list[tuple[str, int]]:
    """grpc.server() options for a server whose models hold `in_flight` RPCs in all."""
    return [("grpc.max_concurrent_streams", max(1, STREAMS_PER_SLOT * in_flight)),
            ("grpc.max_connection_idle_ms", int(idle_s * 1000)),
            ("grpc.keepalive_time_ms", int(KEEPALIVE_S * 1000)),
            ("grpc.keepalive_timeout_ms", int(KEEPALIVE_TIMEOUT_S * 1000)),
            ("grpc.server_handshake_timeout_ms", int(HANDSHAKE_TIMEOUT_S * 1000))]


class _Waiting:
    """One call waiting for its request message; `expired` says why it was cancelled (None: it was not)."""

    __slots__ = ("context", "deadline", "expired")

    def __init__(self, context: grpc.ServicerContext, deadline: float) -> None:
        self.context: grpc.ServicerContext | None = context
        self.deadline = deadline
        self.expired: str | None = None


class ReceiveDeadline(grpc.ServerInterceptor):
    """Cancels a unary call whose request message has not arrived within `timeout_s` of its
    headers, and the longest-waiting call when more than `most` wait; `late(rpc)` hears each one. The
    calls wait in arrival order, which is deadline order (one timeout for all), so the watchdog and the
    bound only ever look at the oldest."""

    def __init__(self, late: Callable[[str], None], timeout_s: float = RECEIVE_TIMEOUT_S,
                 most: int | None = None) -> None:
        self.late, self.timeout_s, self.most = late, timeout_s, most
        self.tick_s = min(TICK_S, timeout_s / 10)  # how late past its deadline a call may be cancelled
        self.waiting: deque[_Waiting] = deque()
        self.count = 0  # calls in `waiting` still waiting (context set)
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.watchdog = threading.Thread(target=self._watch, name="temper-grpc-receive", daemon=True)
        self.watchdog.start()

    def stop(self) -> None:
        self.stopped.set()
        self.watchdog.join()

    def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        handler = continuation(details)
        if handler is None or handler.request_streaming or handler.response_streaming:
            return handler  # unknown, or streaming (ModelStreamInfer: grpc_stream.py keeps its own limits)
        behaviour, rpc = handler.unary_unary, details.method.rpartition("/")[2]

        def received(requests: Any, context: grpc.ServicerContext) -> object:
            waiting = self._arm(context)
            try:
                request = next(requests, None)
            except grpc.RpcError:  # cancelled: by the watchdog, or by the client itself
                request = None
            finally:
                self._disarm(waiting)
            if waiting.expired:
                self.late(rpc)
                context.abort(grpc.StatusCode.DEADLINE_EXCEEDED,  # the call is cancelled: the client reads CANCELLED
                              f"the {rpc} request message {waiting.expired}")
            if request is None:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{rpc} takes exactly one request message")
            return behaviour(request, context)

        return grpc.stream_unary_rpc_method_handler(received, request_deserializer=handler.request_deserializer,
                                                    response_serializer=handler.response_serializer)

    def _arm(self, context: grpc.ServicerContext) -> _Waiting:
        """The watchdog is not woken: it looks every tick_s. Past `most` waiting calls, the oldest goes now."""
        waiting = _Waiting(context, time.monotonic() + self.timeout_s)
        with self.lock:
            self.waiting.append(waiting)
            self.count += 1
            while self.most is not None and self.count > self.most:
                self._cancel_oldest(f"did not arrive before {self.most} later calls waited for theirs")
        return waiting

    def _disarm(self, waiting: _Waiting) -> None:
        with self.lock:  # under the lock: the watchdog never cancels a call whose message came
            if waiting.context is not None:
                waiting.context = None
                self.count -= 1

    def _cancel_oldest(self, why: str) -> None:
        """Cancel the call that has waited longest (under the lock)."""
        while self.waiting:
            oldest = self.waiting.popleft()
            if oldest.context is not None:
                oldest.expired = why
                oldest.context.cancel()
                oldest.context = None
                self.count -= 1
                return

    def _watch(self) -> None:
        while not self.stopped.wait(self.tick_s):
            now = time.monotonic()
            with self.lock:
                while self.waiting and (self.waiting[0].context is None or self.waiting[0].deadline <= now):
                    if self.waiting[0].context is None:
                        self.waiting.popleft()
                    else:
                        self._cancel_oldest(f"did not arrive within {self.timeout_s:g}s")


class _Unparsed:
    """What the lenient parser hands on for bytes that are not the RPC's request message."""

    def __init__(self, error: Exception) -> None:
        self.error = error


class Unparsable(grpc.ServerInterceptor):
    """Answers a request whose bytes do not parse as the RPC's message with INVALID_ARGUMENT, the
    client's mistake; grpcio's own answer is INTERNAL ("Exception deserializing request!"), which
    reads as a server fault. `refused` hears each such ModelInfer, a failed inference request as
    a REST body that is not JSON is."""

    def __init__(self, refused: Callable[[], None]) -> None:
        self.refused = refused

    def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        handler = continuation(details)
        if handler is None or handler.request_streaming or handler.response_streaming:
            return handler  # unknown, or streaming (ModelStreamInfer: grpc_stream.py keeps its own limits)
        parse, behaviour, rpc = handler.request_deserializer, handler.unary_unary, details.method.rpartition("/")[2]

        def lenient(data: bytes) -> object:
            try:
                return parse(data)
            except Exception as exc:  # protobuf's DecodeError
                return _Unparsed(exc)

        def answer(request: object, context: grpc.ServicerContext) -> object:
            if isinstance(request, _Unparsed):
                if rpc == "ModelInfer":
                    self.refused()
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"the {rpc} request does not parse: {request.error}")
            return behaviour(request, context)

        return grpc.unary_unary_rpc_method_handler(answer, request_deserializer=lenient,
                                                   response_serializer=handler.response_serializer)
