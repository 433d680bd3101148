"""gRPC against hostile clients, with real grpcio channels and raw sockets: calls that send their
headers and never the message, connections that never finish the HTTP/2 handshake, idle
connections; each time a normal tritonclient client is answered correctly meanwhile."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import onnxruntime as ort
import pytest

grpc = pytest.importorskip("grpc")
pytest.importorskip("tritonclient.grpc")
from temper.artifacts.serving.grpc_server import SPARE_RPCS, GrpcServer  # noqa: E402 - after the skip
from temper.artifacts.serving.runtime import Runtime  # noqa: E402
from tests.artifacts import grpc_servers  # noqa: E402
from tests.artifacts.grpc_servers import GrpcServed, _correct, _infer, pb, tritongrpc  # noqa: E402
from tests.artifacts.servers import MODEL, _bundle, _expected, _inputs, _tiny_model  # noqa: E402

tiny = grpc_servers.tiny
MAX_QUEUE = 1  # as the finding: 1 queued + 16 rows + SPARE_RPCS slots in all
SLOTS = MAX_QUEUE + 16 + SPARE_RPCS
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes(9)[:3] + b"\x04" + bytes(5)  # + an empty SETTINGS frame


@pytest.fixture(scope="module")
def queue_of_one(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("queue-of-one")
    return _bundle(root / "bundle", _tiny_model(root / "tiny.onnx"), MODEL, max_batch_size=16, max_delay_ms=2,
                   max_queue=MAX_QUEUE)


class Silent:
    """`calls` ModelInfer calls on each of `connections` connections of their own that send their
    headers and never the request message (a client-streaming call whose iterator never yields)."""

    def __init__(self, port: int, connections: int, calls: int) -> None:
        self.release = threading.Event()
        self.channels = [grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)])
                         for _ in range(connections)]
        stubs = [c.stream_unary("/inference.GRPCInferenceService/ModelInfer",
                                request_serializer=pb.ModelInferRequest.SerializeToString,
                                response_deserializer=pb.ModelInferResponse.FromString) for c in self.channels]
        self.futures = [stub.future(self._never()) for stub in stubs for _ in range(calls)]

    def _never(self) -> Iterator[pb.ModelInferRequest]:
        self.release.wait()
        yield from ()

    def codes(self) -> list[grpc.StatusCode | None]:
        return [f.exception().code() if f.exception() else None for f in self.futures if f.done()]

    def close(self) -> None:
        self.release.set()
        for channel in self.channels:
            channel.close()


def _answered(port: int, reference: ort.InferenceSession, seed: int) -> None:
    c = tritongrpc.InferenceServerClient(f"127.0.0.1:{port}")
    inputs = _inputs(seed, rows=3)
    assert _correct(_infer(c, inputs, client_timeout=30), _expected(reference, inputs))
    c.close()


def test_calls_without_a_message_on_one_connection_leave_the_others_their_slots(
        queue_of_one: Path, reference: ort.InferenceSession) -> None:
    """More silent calls than the server has slots, on one connection: it holds at most half of
    them (MAX_CONCURRENT_STREAMS), so a normal client is answered while they still wait. On main
    every other client got RESOURCE_EXHAUSTED "Concurrent RPC limit exceeded!"."""
    with GrpcServed(Runtime(queue_of_one)) as served:
        silent = Silent(served.port, connections=1, calls=2 * SLOTS)
        try:
            time.sleep(0.5)  # their headers are in
            _answered(served.port, reference, 1)
            assert silent.codes() == []  # none refused, none timed out yet: the client queues its extra calls
        finally:
            silent.close()


def test_a_call_whose_message_never_comes_is_cancelled_at_the_receive_deadline(
        queue_of_one: Path, reference: ort.InferenceSession) -> None:
    """Silent calls on several connections take every slot; at the receive deadline each admitted
    one is cancelled, counted a failed inference request, and a normal client is answered again."""
    runtime = Runtime(queue_of_one)
    runtime.start()
    server = GrpcServer(runtime, "127.0.0.1", 0, receive_timeout_s=1.0)
    port = server.start()
    silent = Silent(port, connections=3, calls=SLOTS // 2)
    try:
        for _ in range(300):  # up to 30 s; on main they waited for ever
            if len(silent.codes()) == len(silent.futures):
                break
            time.sleep(0.1)
        codes = silent.codes()
        assert len(codes) == len(silent.futures), f"{len(codes)} of {len(silent.futures)} silent calls ended"
        cancelled = codes.count(grpc.StatusCode.CANCELLED)
        assert cancelled > 0 and set(codes) <= {grpc.StatusCode.CANCELLED, grpc.StatusCode.RESOURCE_EXHAUSTED}
        assert runtime.metrics.snapshot()["failures"]["OTHER"] == cancelled
        _answered(port, reference, 2)
        assert runtime.metrics.snapshot()["request_success"] == 1
    finally:
        silent.close()
        server.stop(grace_s=1)
        runtime.stop()


def _closed_after(sock: socket.socket, send: bytes = b"") -> bytes:
    """What the server wrote before closing `sock` (60 s at most)."""
    sock.settimeout(60)
    if send:
        sock.sendall(send)
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received


@pytest.mark.slow  # waits HANDSHAKE_TIMEOUT_S, 5 s
def test_a_connection_that_never_starts_http2_is_closed(tiny: Path, reference: ort.InferenceSession) -> None:
    """A TCP connection that never sends the HTTP/2 preface is closed after HANDSHAKE_TIMEOUT_S
    (gRPC's default: 120 s), saying why; a normal client is answered meanwhile."""
    with GrpcServed(Runtime(tiny)) as served, socket.create_connection(("127.0.0.1", served.port)) as silent:
        _answered(served.port, reference, 3)
        assert b"handshake timeout" in _closed_after(silent)


def test_an_idle_connection_is_sent_goaway_and_closed(tiny: Path, reference: ort.InferenceSession) -> None:
    """A connection that finished the handshake and sends no call is closed after idle_s (GOAWAY,
    frame type 7); a normal client's next call, after its own idle connection closed, is answered."""
    runtime = Runtime(tiny)
    runtime.start()
    server = GrpcServer(runtime, "127.0.0.1", 0, idle_s=0.5)
    port = server.start()
    try:
        c = tritongrpc.InferenceServerClient(f"127.0.0.1:{port}")
        inputs = _inputs(4, rows=2)
        assert _correct(_infer(c, inputs), _expected(reference, inputs))
        with socket.create_connection(("127.0.0.1", port)) as idle:
            written = _closed_after(idle, PREFACE)
        assert b"\x07\x00\x00\x00\x00\x00" in written  # a GOAWAY frame header: type 7, no flags, stream 0
        time.sleep(1)  # the client's connection went idle too
        inputs = _inputs(5, rows=2)
        assert _correct(_infer(c, inputs), _expected(reference, inputs))
        c.close()
    finally:
        server.stop(grace_s=1)
        runtime.stop()
