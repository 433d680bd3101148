"""`temper serve --grpc-port`: the KServe v2 / Triton gRPC API, driven by tritonclient.grpc (Triton's own
client) and by the raw generated stub for requests the client would never build. Answers are compared
with ONNX Runtime run directly; every bad request gets its status code and the server serves on."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

grpc = pytest.importorskip("grpc")
tritongrpc = pytest.importorskip("tritonclient.grpc")
from tritonclient.grpc import service_pb2 as pb  # noqa: E402 - after the skip when tritonclient is missing
from tritonclient.grpc import service_pb2_grpc as pb_grpc  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

from artifacts import bundle  # noqa: E402
from artifacts.grpc_server import GrpcServer  # noqa: E402
from artifacts.runtime import Runtime  # noqa: E402
from tests.conftest import REPO  # noqa: E402

MODEL = "tiny"
OUTPUTS = ["y", "total"]


def _tiny_model(path: Path) -> Path:
    """y = x @ W + b (FP32 [-1, 4] -> [-1, 2]) and total = row sums of ids (INT64 [-1, 3] -> [-1, 1])."""
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["xw"]), helper.make_node("Add", ["xw", "B"], ["y"]),
         helper.make_node("ReduceSum", ["ids", "axes"], ["total"], keepdims=1)],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4]),
         helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2]),
         helper.make_tensor_value_info("total", TensorProto.INT64, ["batch", 1])],
        [numpy_helper.from_array(rng.standard_normal((4, 2)).astype(np.float32), "W"),
         numpy_helper.from_array(rng.standard_normal(2).astype(np.float32), "B"),
         numpy_helper.from_array(np.array([1], dtype=np.int64), "axes")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _slow_model(path: Path) -> Path:
    """y = sum(relu(tile(x) @ W)) chained 24 times: milliseconds per row, so a queue of one fills."""
    w = (np.random.default_rng(1).standard_normal((1024, 1024)) / 32).astype(np.float32)
    nodes = [helper.make_node("Tile", ["x", "repeats"], ["h0"])]
    for i in range(24):
        nodes += [helper.make_node("MatMul", [f"h{i}", "W"], [f"m{i}"]),
                  helper.make_node("Relu", [f"m{i}"], [f"h{i + 1}"])]
    nodes.append(helper.make_node("ReduceSum", ["h24", "axes"], ["y"], keepdims=1))
    graph = helper.make_graph(
        nodes, "slow", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 1])],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(np.array([1, 256], dtype=np.int64), "repeats"),
         numpy_helper.from_array(np.array([1], dtype=np.int64), "axes")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _bundle(folder: Path, model: Path, name: str, **serving: object) -> Path:
    return bundle.write(folder, model, bundle.config_for(model, name, **serving))


class GrpcServed:
    """A GrpcServer on a free loopback port; the runtime started (warm) unless told otherwise."""

    def __init__(self, runtime: Runtime, start_runtime: bool = True) -> None:
        self.runtime, self.start_runtime = runtime, start_runtime
        self.server = GrpcServer(runtime, "127.0.0.1", 0)

    def __enter__(self) -> GrpcServed:
        if self.start_runtime:
            self.runtime.start()
        self.port = self.server.start()
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")
        self.stub = pb_grpc.GRPCInferenceServiceStub(self.channel)
        return self

    def client(self) -> tritongrpc.InferenceServerClient:
        return tritongrpc.InferenceServerClient(f"127.0.0.1:{self.port}")

    def __exit__(self, *exc: object) -> None:
        self.channel.close()
        self.server.stop(grace_s=1)
        self.runtime.stop()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tiny")
    return _bundle(root / "bundle", _tiny_model(root / "tiny.onnx"), MODEL, max_batch_size=16, max_delay_ms=2)


@pytest.fixture(scope="module")
def reference(tiny: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(tiny / bundle.MODEL), providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def served(tiny: Path) -> Iterator[GrpcServed]:
    with GrpcServed(Runtime(tiny)) as s:
        yield s


@pytest.fixture
def client(served: GrpcServed) -> Iterator[tritongrpc.InferenceServerClient]:
    c = served.client()
    yield c
    c.close()


def _inputs(seed: int, rows: int = 2) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((rows, 4)).astype(np.float32),
            "ids": rng.integers(0, 1000, (rows, 3)).astype(np.int64)}


def _expected(session: ort.InferenceSession, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return dict(zip(OUTPUTS, session.run(OUTPUTS, inputs)))


def _infer(c: tritongrpc.InferenceServerClient, inputs: dict[str, np.ndarray],
           **kwargs: object) -> tritongrpc.InferResult:
    """Through tritonclient: raw_input_contents in, raw_output_contents out."""
    return c.infer(MODEL, _triton_inputs(inputs), **kwargs)


def _triton_inputs(inputs: dict[str, np.ndarray]) -> list[tritongrpc.InferInput]:
    items = []
    for name, array in inputs.items():
        item = tritongrpc.InferInput(name, list(array.shape), {"float32": "FP32", "int64": "INT64"}[array.dtype.name])
        item.set_data_from_numpy(array)
        items.append(item)
    return items


def _correct(result: tritongrpc.InferResult, want: dict[str, np.ndarray], atol: float = 1e-6) -> bool:
    return bool(np.allclose(result.as_numpy("y"), want["y"], rtol=0, atol=atol)
                and np.array_equal(result.as_numpy("total"), want["total"]))


def _typed_request(inputs: dict[str, np.ndarray], **fields: object) -> pb.ModelInferRequest:
    """A ModelInferRequest carrying the data in typed contents (fp32_contents, int64_contents)."""
    request = pb.ModelInferRequest(**{"model_name": MODEL, **fields})
    x = request.inputs.add(name="x", datatype="FP32", shape=list(inputs["x"].shape))
    x.contents.fp32_contents.extend(inputs["x"].ravel().tolist())
    ids = request.inputs.add(name="ids", datatype="INT64", shape=list(inputs["ids"].shape))
    ids.contents.int64_contents.extend(inputs["ids"].ravel().tolist())
    return request


def _raw_request(inputs: dict[str, np.ndarray], **fields: object) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(**{"model_name": MODEL, **fields})
    for name, array in inputs.items():
        datatype = {"float32": "FP32", "int64": "INT64"}[array.dtype.name]
        request.inputs.add(name=name, datatype=datatype, shape=array.shape)
        request.raw_input_contents.append(array.astype(array.dtype.newbyteorder("<")).tobytes())
    return request


def _outputs(response: pb.ModelInferResponse) -> dict[str, np.ndarray]:
    dtypes = {"FP32": "<f4", "INT64": "<i8"}
    return {out.name: np.frombuffer(raw, dtypes[out.datatype]).reshape(out.shape)
            for out, raw in zip(response.outputs, response.raw_output_contents)}


# -- health, metadata ----------------------------------------------------------------------------


def test_health_and_metadata(client: tritongrpc.InferenceServerClient) -> None:
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready(MODEL) and client.is_model_ready(MODEL, "1")
    assert client.get_server_metadata(as_json=True)["name"] == "temper"
    assert client.get_model_metadata(MODEL, as_json=True) == {
        "name": MODEL, "versions": ["1"], "platform": "onnxruntime",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": ["-1", "4"]},
                   {"name": "ids", "datatype": "INT64", "shape": ["-1", "3"]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": ["-1", "2"]},
                    {"name": "total", "datatype": "INT64", "shape": ["-1", "1"]}],
    }


def test_not_ready_until_the_runtime_has_started(tiny: Path) -> None:
    """Bound before the warm-up (as `temper serve` does): live, not ready, inference UNAVAILABLE."""
    with GrpcServed(Runtime(tiny), start_runtime=False) as s:
        c = s.client()
        assert c.is_server_live() and not c.is_server_ready() and not c.is_model_ready(MODEL)
        with pytest.raises(InferenceServerException) as refused:
            _infer(c, _inputs(0))
        assert refused.value.status() == "StatusCode.UNAVAILABLE" and "not ready" in refused.value.message()
        c.close()


# -- inference -----------------------------------------------------------------------------------


@pytest.mark.parametrize("rows", [1, 16])
def test_infer_equals_onnxruntime(client: tritongrpc.InferenceServerClient, reference: ort.InferenceSession,
                                  rows: int) -> None:
    inputs = _inputs(rows, rows)
    result = _infer(client, inputs, request_id="req-7")
    want = _expected(reference, inputs)
    assert result.get_response().id == "req-7" and result.get_response().model_name == MODEL
    assert float(np.abs(result.as_numpy("y") - want["y"]).max()) <= 1e-6
    np.testing.assert_array_equal(result.as_numpy("total"), want["total"])
    assert result.as_numpy("y").dtype == np.float32 and result.as_numpy("total").shape == (rows, 1)


def test_typed_contents_and_requested_outputs(served: GrpcServed, reference: ort.InferenceSession) -> None:
    inputs = _inputs(3, rows=5)
    request = _typed_request(inputs, id="typed")
    request.outputs.add(name="total")
    response = served.stub.ModelInfer(request)
    assert response.id == "typed" and [o.name for o in response.outputs] == ["total"]
    np.testing.assert_array_equal(_outputs(response)["total"], _expected(reference, inputs)["total"])
    got = _outputs(served.stub.ModelInfer(_typed_request(inputs)))
    np.testing.assert_allclose(got["y"], _expected(reference, inputs)["y"], rtol=0, atol=1e-6)


def _batches(runtime: Runtime) -> tuple[int, int]:
    m = runtime.metrics.snapshot()
    return m["request_success"], m["execution_count"]


def test_32_threads_get_their_own_answers_in_batches(served: GrpcServed, reference: ort.InferenceSession) -> None:
    before = _batches(served.runtime)
    rounds, start = 12, threading.Barrier(32)

    def one_client(index: int) -> list[str]:
        c, problems = served.client(), []
        start.wait()
        for turn in range(rounds):
            inputs = _inputs(1000 + index * rounds + turn, rows=1 + (index + turn) % 3)
            if not _correct(_infer(c, inputs), _expected(reference, inputs), atol=1e-5):
                problems.append(f"client {index} turn {turn}: wrong answer")
        c.close()
        return problems

    with ThreadPoolExecutor(32) as pool:
        assert [p for found in pool.map(one_client, range(32)) for p in found] == []
    requests, executions = (after - was for after, was in zip(_batches(served.runtime), before))
    assert requests == 32 * rounds and executions < requests, (requests, executions)


def test_async_client_at_concurrency_32(served: GrpcServed, reference: ort.InferenceSession) -> None:
    """tritonclient's async_infer: 32 requests in flight on one channel at a time, 5 rounds."""
    c = served.client()
    before = _batches(served.runtime)
    for round_ in range(5):
        done, results = threading.Semaphore(0), {}

        def callback(index: int, result: tritongrpc.InferResult, error: InferenceServerException | None,
                     results: dict = results, done: threading.Semaphore = done) -> None:
            results[index] = error or result
            done.release()

        sent = {i: _inputs(5000 + round_ * 32 + i, rows=1 + i % 4) for i in range(32)}
        for i, inputs in sent.items():
            c.async_infer(MODEL, _triton_inputs(inputs), partial(callback, i))
        for _ in sent:
            assert done.acquire(timeout=60)
        assert all(_correct(results[i], _expected(reference, inputs), atol=1e-5) for i, inputs in sent.items())
    c.close()
    requests, executions = (after - was for after, was in zip(_batches(served.runtime), before))
    assert requests == 160 and executions < requests, (requests, executions)


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


def test_unknown_model_or_version_is_not_found(served: GrpcServed, client: tritongrpc.InferenceServerClient) -> None:
    for call in (lambda: served.stub.ModelInfer(_raw_request(_inputs(8), model_name="other")),
                 lambda: served.stub.ModelInfer(_raw_request(_inputs(8), model_version="2")),
                 lambda: served.stub.ModelMetadata(pb.ModelMetadataRequest(name="other")),
                 lambda: served.stub.ModelReady(pb.ModelReadyRequest(name="other"))):
        with pytest.raises(grpc.RpcError) as refused:
            call()
        assert refused.value.code() == grpc.StatusCode.NOT_FOUND, refused.value
    with pytest.raises(InferenceServerException) as refused:  # as Triton's client reports it
        client.infer("other", _triton_inputs(_inputs(8)))
    assert refused.value.status() == "StatusCode.NOT_FOUND" and "unknown model 'other'" in refused.value.message()
    assert _infer(client, _inputs(9)).as_numpy("y").shape == (2, 2)


def test_unimplemented_rpcs_say_so(served: GrpcServed) -> None:
    with pytest.raises(grpc.RpcError) as refused:
        served.stub.RepositoryIndex(pb.RepositoryIndexRequest())
    assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_a_busy_port_is_an_os_error(tiny: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        server = GrpcServer(Runtime(tiny), "127.0.0.1", taken.getsockname()[1])
        with pytest.raises(OSError, match="cannot listen for gRPC on 127.0.0.1:"):
            server.start()


def test_queue_full_is_resource_exhausted_and_the_server_recovers(tmp_path: Path) -> None:
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
        assert set(codes) == {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED}, codes
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


# -- the CLI -------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_temper_serve_with_grpc_port(tiny: Path, reference: ort.InferenceSession) -> None:
    """One process serves REST and gRPC from the same runtime; Ctrl-C stops both."""
    port, grpc_port = _free_port(), _free_port()
    code = "import sys; from pipeline.cli import main; sys.argv[0] = 'temper'; main()"
    process = subprocess.Popen([sys.executable, "-c", code, "serve", str(tiny), "--port", str(port),
                                "--grpc-port", str(grpc_port)], cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        c = tritongrpc.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        for _ in range(600):  # up to 60 s for start-up and warm-up
            assert process.poll() is None, process.communicate()
            try:
                if c.is_server_ready():
                    break
            except InferenceServerException:
                pass  # not listening yet
            time.sleep(0.1)
        inputs = _inputs(13, rows=4)
        assert _correct(_infer(c, inputs), _expected(reference, inputs))
        c.close()
    finally:
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=30)
    # a graceful stop; main() may report the Ctrl-C uvicorn re-raises after shutting down as 128 + SIGINT
    assert process.returncode in (0, 128 + signal.SIGINT) and "Traceback" not in stderr, stderr
    assert f"127.0.0.1:{grpc_port}" in stdout and "gRPC" in stdout


def test_grpc_port_without_grpc_installed_is_one_line_exit_3(temper, tiny: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "grpc", None)  # `import grpc` now fails as if it were not installed
    monkeypatch.delitem(sys.modules, "artifacts.grpc_server")
    result = temper("serve", tiny, "--grpc-port", "8101")
    lines = result.stderr.strip().splitlines()
    assert result.code == 3 and len(lines) == 1, result.stderr
    assert lines[0].startswith("error: --grpc-port: ") and "temper-ml[grpc]" in lines[0]


def test_grpc_port_equal_to_port_is_refused(temper, tiny: Path) -> None:
    result = temper("serve", tiny, "--port", "8102", "--grpc-port", "8102")
    assert result.code == 2 and "--grpc-port" in result.stderr and "must differ" in result.stderr
