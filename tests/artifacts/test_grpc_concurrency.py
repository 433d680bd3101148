"""gRPC: a normal client's concurrency is never refused by the limits that bound hostile calls, with a real
tritonclient.grpc client against a real GrpcServer. A client with more calls in flight on one connection than
half the server's slots got UNAVAILABLE (RST_STREAM REFUSED_STREAM, from MAX_CONCURRENT_STREAMS =
in_flight // 2), and calls that send their headers and never the message, over 2-4 connections, took every
slot of grpcio's `maximum_concurrent_rpcs` so that normal calls got RESOURCE_EXHAUSTED; neither moved a
failure metric. Now a client's calls queue (as Triton's do), calls waiting for their message are bounded by
cancelling the oldest, and every refusal is a counted failure with its reason."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

grpc = pytest.importorskip("grpc")
pytest.importorskip("tritonclient.grpc")
from temper.artifacts.serving.grpc_limits import most_waiting  # noqa: E402 - after the skip
from temper.artifacts.serving.grpc_server import SPARE_RPCS, GrpcServer  # noqa: E402
from temper.artifacts.serving.runtime import Runtime  # noqa: E402
from tests.artifacts import grpc_servers  # noqa: E402
from tests.artifacts.grpc_servers import _triton_inputs, tritongrpc  # noqa: E402
from tests.artifacts.servers import MODEL, _bundle, _expected, _inputs, _tiny_model  # noqa: E402
from tests.artifacts.test_grpc_hostile import Silent  # noqa: E402

tiny = grpc_servers.tiny
MAX_QUEUE = 64
SLOTS = MAX_QUEUE + 16 + SPARE_RPCS  # what the server admitted in all: 88, so 44 streams per connection


@pytest.fixture(scope="module")
def queue_of_64(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("queue-of-64")
    return _bundle(root / "bundle", _tiny_model(root / "tiny.onnx"), MODEL, max_batch_size=16, max_delay_ms=2,
                   max_queue=MAX_QUEUE)


def _burst(port: int, reference: ort.InferenceSession, calls: int, seed: int) -> list[str]:
    """`calls` inferences in flight at once on one tritonclient connection; the failures' status codes (each
    answer that came is checked against ONNX Runtime's)."""
    client = tritongrpc.InferenceServerClient(f"127.0.0.1:{port}")
    done, lock, failures, wrong = threading.Event(), threading.Lock(), [], []
    left = [calls]
    requests = [_inputs(seed + k, rows=1 + k % 3) for k in range(calls)]

    def answered(k: int, result: tritongrpc.InferResult | None, error: Exception | None) -> None:
        with lock:
            if error is not None:
                failures.append(str(error.status()))
            else:
                want = _expected(reference, requests[k])
                if not (np.allclose(result.as_numpy("y"), want["y"], atol=1e-6)
                        and np.array_equal(result.as_numpy("total"), want["total"])):
                    wrong.append(k)
            left[0] -= 1
            if left[0] == 0:
                done.set()

    for k in range(calls):
        client.async_infer(MODEL, _triton_inputs(requests[k]), client_timeout=60,
                           callback=lambda result, error, k=k: answered(k, result, error))
    assert done.wait(90), f"{left[0]} of {calls} calls unanswered"
    client.close()
    assert not wrong, f"wrong answers to calls {wrong}"
    return failures


def test_a_client_with_more_calls_in_flight_than_half_the_slots_is_answered(
        queue_of_64: Path, reference: ort.InferenceSession) -> None:
    """80 calls at once on one connection, under what the model holds queued and running (80 + SPARE): each
    is answered. MAX_CONCURRENT_STREAMS was 44 here, and the calls past it were refused (REFUSED_STREAM)."""
    with grpc_servers.GrpcServed(Runtime(queue_of_64)) as served:
        for attempt in range(3):
            assert _burst(served.port, reference, MAX_QUEUE + 16, seed=100 * attempt) == []
        snapshot = served.runtime.metrics.snapshot()
        assert snapshot["request_failure"] == 0 and snapshot["request_success"] == 3 * (MAX_QUEUE + 16)


@pytest.mark.parametrize("connections", [2, 4])
def test_calls_without_a_message_over_several_connections_refuse_no_normal_call(
        queue_of_64: Path, reference: ort.InferenceSession, connections: int) -> None:
    """Four times as many silent calls as the server has slots, spread over 2 or 4 connections, then a normal
    client with 40 calls in flight: every one is answered, and quickly (the silent calls' receive deadline is
    30 s). The silent calls past the bound on waiting calls are cancelled, oldest first, each a counted
    failure (OTHER)."""
    runtime = Runtime(queue_of_64)
    runtime.start()
    server = GrpcServer(runtime, "127.0.0.1", 0, receive_timeout_s=30)
    port = server.start()
    silent = Silent(port, connections=connections, calls=4 * SLOTS // connections)
    try:
        time.sleep(1)  # their headers are in
        began = time.monotonic()
        assert _burst(port, reference, 40, seed=7) == []
        assert time.monotonic() - began < 15
        codes = silent.codes()
        assert set(codes) == {grpc.StatusCode.CANCELLED} and len(codes) >= len(silent.futures) - most_waiting(SLOTS)
        # each silent call turned away is counted: by the server thread that held it, which records it just after
        # the client sees its cancellation, so the count may trail the codes for a moment
        deadline = time.monotonic() + 10
        while runtime.metrics.snapshot()["failures"]["OTHER"] < len(codes) and time.monotonic() < deadline:
            time.sleep(0.05)
        snapshot = runtime.metrics.snapshot()
        assert snapshot["request_success"] == 40
        assert snapshot["failures"]["OTHER"] == len(codes)
    finally:
        silent.close()
        server.stop(grace_s=1)
        runtime.stop()


def test_calls_past_what_the_model_holds_are_refused_as_queue_full_and_counted(
        queue_of_64: Path, reference: ort.InferenceSession) -> None:
    """3 x the slots at once on one connection: the calls the queue cannot hold are UNAVAILABLE "Exceeds
    maximum queue size" (as Triton), each counted REJECTED; none is refused by a stream or RPC limit unseen."""
    with grpc_servers.GrpcServed(Runtime(queue_of_64)) as served:
        failures = _burst(served.port, reference, 3 * SLOTS, seed=11)
        snapshot = served.runtime.metrics.snapshot()
        assert set(failures) <= {"StatusCode.UNAVAILABLE"}, failures
        assert snapshot["failures"]["REJECTED"] == len(failures) == snapshot["request_failure"]
        assert snapshot["request_success"] == 3 * SLOTS - len(failures)
