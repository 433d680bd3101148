"""`temper serve --grpc-port` refusing what it cannot answer, through the raw generated stub for
requests tritonclient would never build: every bad request, unknown model, full queue or stopped
runtime gets its status code and the server serves on."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

grpc = pytest.importorskip("grpc")
tritongrpc = pytest.importorskip("tritonclient.grpc")
from tritonclient.grpc import service_pb2 as pb  # noqa: E402 - after the skip when tritonclient is missing
from tritonclient.utils import InferenceServerException  # noqa: E402

from temper.artifacts.serving.grpc_server import GrpcServer  # noqa: E402
from temper.artifacts.serving.runtime import Runtime  # noqa: E402
from tests.artifacts import grpc_servers  # noqa: E402
from tests.artifacts.grpc_servers import (  # noqa: E402
    GrpcServed,
    _infer,
    _outputs,
    _raw_request,
    _triton_inputs,
    _typed_request,
)
from tests.artifacts.servers import MODEL, _bundle, _expected, _inputs, _slow_model  # noqa: E402

# the gRPC fixtures, over conftest.py's HTTP ones of the same names
tiny, served, client = grpc_servers.tiny, grpc_servers.served, grpc_servers.client


# -- bad requests --------------------------------------------------------------------------------


def _shape(request: pb.ModelInferRequest, shape: list[int]) -> None:
    request.inputs[0].ClearField("shape")
    request.inputs[0].shape.extend(shape)


def _twice(request: pb.ModelInferRequest) -> None:
    request.inputs.append(request.inputs[0])
    request.raw_input_contents.append(request.raw_input_contents[0])


def _missing(request: pb.ModelInferRequest) -> None:
    request.inputs.pop()
    request.raw_input_contents.pop()


def _typed_count(request: pb.ModelInferRequest) -> None:
    request.CopyFrom(_typed_request(_inputs(6)))
    request.inputs[1].contents.int64_contents.append(1)


def _typed_field(request: pb.ModelInferRequest) -> None:
    request.CopyFrom(_typed_request(_inputs(6)))
    request.inputs[0].contents.ClearField("fp32_contents")
    request.inputs[0].contents.int64_contents.extend([1] * 8)


INVALID = {  # a change to a good raw request -> words the INVALID_ARGUMENT message must hold
    "unknown input": (lambda r: setattr(r.inputs[0], "name", "z"), "unknown input 'z'"),
    "missing input": (_missing, "missing input"),
    "input given twice": (_twice, "twice"),
    "wrong datatype": (lambda r: setattr(r.inputs[0], "datatype", "FP64"), "datatype 'FP64'"),
    "wrong shape for the model": (lambda r: _shape(r, [1, 8]), "shape"),
    "negative dim": (lambda r: _shape(r, [-2, 4]), "non-negative"),
    "raw bytes not matching the shape": (lambda r: r.raw_input_contents.__setitem__(0, b"\0" * 12), "raw bytes"),
    "fewer raw contents than inputs": (lambda r: r.raw_input_contents.pop(), "one per input"),
    "raw and typed contents together": (lambda r: r.inputs[0].contents.fp32_contents.extend([0.0] * 8), "raw_input"),
    "batch over max_batch_size": (lambda r: r.CopyFrom(_raw_request(_inputs(6, rows=17))), "max_batch_size"),
    "unknown output": (lambda r: r.outputs.add(name="nope"), "unknown output 'nope'"),
    "typed contents not matching the shape": (_typed_count, "values"),
    "FP32 data in int64_contents": (_typed_field, "fp32_contents values"),
}


@pytest.mark.parametrize("change, message", INVALID.values(), ids=INVALID.keys())
def test_bad_request_is_invalid_argument_and_the_server_keeps_serving(
        served: GrpcServed, reference: ort.InferenceSession, change: Callable[[pb.ModelInferRequest], object],
        message: str) -> None:
    with pytest.raises(grpc.RpcError) as refused:
        request = _raw_request(_inputs(6))
        change(request)
        served.stub.ModelInfer(request)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.value
    assert message in refused.value.details()
    inputs = _inputs(7)
    np.testing.assert_allclose(_outputs(served.stub.ModelInfer(_raw_request(inputs)))["y"],
                               _expected(reference, inputs)["y"], rtol=0, atol=1e-6)


def test_bytes_that_are_not_a_protobuf_message_are_invalid_argument(served: GrpcServed,
                                                                    reference: ort.InferenceSession) -> None:
    """grpcio answers a request it cannot parse with INTERNAL, which reads as a server fault."""
    before = served.runtime.metrics.snapshot()["failures"]["OTHER"]
    for method in ("ModelInfer", "ModelMetadata"):
        raw = served.channel.unary_unary(f"/inference.GRPCInferenceService/{method}")  # bytes in, bytes out
        with pytest.raises(grpc.RpcError) as refused:
            raw(b"\xff\xff\xff\xff")
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.value
        assert refused.value.details().startswith(f"the {method} request does not parse: Error parsing message")
    assert served.runtime.metrics.snapshot()["failures"]["OTHER"] == before + 1  # a failed inference, as in REST
    inputs = _inputs(10)
    np.testing.assert_allclose(_outputs(served.stub.ModelInfer(_raw_request(inputs)))["y"],
                               _expected(reference, inputs)["y"], rtol=0, atol=1e-6)


def test_unknown_model_or_version_is_not_found(served: GrpcServed, client: tritongrpc.InferenceServerClient) -> None:
    for call in (lambda: served.stub.ModelInfer(_raw_request(_inputs(8), model_name="other")),
                 lambda: served.stub.ModelInfer(_raw_request(_inputs(8), model_version="2")),
                 lambda: served.stub.ModelMetadata(pb.ModelMetadataRequest(name="other")),
                 lambda: served.stub.ModelConfig(pb.ModelConfigRequest(name="other")),
                 lambda: served.stub.ModelStatistics(pb.ModelStatisticsRequest(name="other"))):
        with pytest.raises(grpc.RpcError) as refused:
            call()
        assert refused.value.code() == grpc.StatusCode.NOT_FOUND, refused.value
    with pytest.raises(InferenceServerException) as refused:  # as Triton's client reports it
        client.infer("other", _triton_inputs(_inputs(8)))
    assert refused.value.status() == "StatusCode.NOT_FOUND" and "unknown model 'other'" in refused.value.message()
    assert _infer(client, _inputs(9)).as_numpy("y").shape == (2, 2)


def test_an_unknown_model_or_version_is_not_ready_rather_than_an_error(
        client: tritongrpc.InferenceServerClient) -> None:
    """Triton answers ModelReady for a model it does not have with ready: false; clients branch on it."""
    assert not client.is_model_ready("other") and not client.is_model_ready(MODEL, "2")
    assert client.is_model_ready(MODEL)


def test_unimplemented_rpcs_say_so(served: GrpcServed) -> None:
    with pytest.raises(grpc.RpcError) as refused:
        served.stub.TraceSetting(pb.TraceSettingRequest())
    assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_a_busy_port_is_an_os_error(tiny: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        server = GrpcServer(Runtime(tiny), "127.0.0.1", taken.getsockname()[1])
        with pytest.raises(OSError, match="cannot listen for gRPC on 127.0.0.1:"):
            server.start()


def test_queue_full_is_unavailable_as_in_triton_and_the_server_recovers(tmp_path: Path) -> None:
    """Triton answers a full queue UNAVAILABLE "Exceeds maximum queue size"; RESOURCE_EXHAUSTED is only
    gRPC's own in-flight limit, which a few spare RPCs keep behind the queue's."""
    folder = _bundle(tmp_path / "bundle", _slow_model(tmp_path / "slow.onnx"), "slow", max_batch_size=1, max_queue=1)
    request = pb.ModelInferRequest(model_name="slow")
    request.inputs.add(name="x", datatype="FP32", shape=[1, 4])
    request.raw_input_contents.append(np.ones((1, 4), "<f4").tobytes())
    with GrpcServed(Runtime(folder)) as s:
        start = threading.Barrier(16)

        def one(_: int) -> grpc.StatusCode:
            start.wait()
            try:
                s.stub.ModelInfer(request, timeout=60)
                return grpc.StatusCode.OK
            except grpc.RpcError as exc:
                return exc.code()

        with ThreadPoolExecutor(16) as pool:
            codes = list(pool.map(one, range(16)))
        assert grpc.StatusCode.OK in codes and grpc.StatusCode.UNAVAILABLE in codes, codes
        assert set(codes) <= {grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED}
        assert s.stub.ModelInfer(request).outputs[0].shape == [1, 1]


def test_rpcs_queued_when_the_runtime_stops_are_unavailable(tmp_path: Path) -> None:
    """`temper serve --grpc-port` stops the runtime (REST lifespan) before the gRPC server: RPCs still
    queued then answer UNAVAILABLE at once, not INTERNAL, nor DEADLINE_EXCEEDED after timeout_s."""
    folder = _bundle(tmp_path / "bundle", _slow_model(tmp_path / "slow.onnx"), "slow", max_batch_size=16)
    request = pb.ModelInferRequest(model_name="slow")
    request.inputs.add(name="x", datatype="FP32", shape=[16, 4])  # a whole batch each: one ~100 ms run per RPC
    request.raw_input_contents.append(np.ones((16, 4), "<f4").tobytes())
    runtime = Runtime(folder)
    with GrpcServed(runtime) as s:

        def one(_: int) -> grpc.StatusCode:
            try:
                s.stub.ModelInfer(request, timeout=60)
                return grpc.StatusCode.OK
            except grpc.RpcError as exc:
                return exc.code()

        with ThreadPoolExecutor(6) as pool:
            calls = [pool.submit(one, i) for i in range(6)]
            deadline = time.monotonic() + 30
            while runtime.pending < 2:
                assert time.monotonic() < deadline, "the RPCs never queued"
                time.sleep(0.001)
            runtime.stop()
            codes = [call.result(timeout=30) for call in calls]
        assert set(codes) <= {grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE}, codes
        assert grpc.StatusCode.UNAVAILABLE in codes
        with pytest.raises(grpc.RpcError) as late:
            s.stub.ModelInfer(request, timeout=10)
        assert late.value.code() == grpc.StatusCode.UNAVAILABLE

