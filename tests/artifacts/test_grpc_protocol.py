"""`temper serve --grpc-port`: the KServe v2 / Triton gRPC API's health, metadata and inference,
driven by tritonclient.grpc (Triton's own client) and by the raw generated stub, from one client and
from many at once. Answers are compared with ONNX Runtime run directly."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

pytest.importorskip("grpc")
tritongrpc = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException  # noqa: E402

from temper.artifacts.serving.runtime import Runtime  # noqa: E402
from tests.artifacts import grpc_servers  # noqa: E402
from tests.artifacts.grpc_servers import (  # noqa: E402
    GrpcServed,
    _correct,
    _infer,
    _outputs,
    _triton_inputs,
    _typed_request,
)
from tests.artifacts.servers import MODEL, _expected, _inputs  # noqa: E402

# the gRPC fixtures, over conftest.py's HTTP ones of the same names
tiny, served, client = grpc_servers.tiny, grpc_servers.served, grpc_servers.client


# -- health, metadata ----------------------------------------------------------------------------


def test_health_and_metadata(client: tritongrpc.InferenceServerClient) -> None:
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready(MODEL) and client.is_model_ready(MODEL, "1")
    assert client.get_server_metadata(as_json=True) == {  # as REST's /v2 says, and Triton's extension names
        "name": "temper", "version": "1",
        "extensions": ["binary_tensor_data", "model_configuration", "model_repository", "statistics",
                       "system_shared_memory"]}
    assert client.get_model_metadata(MODEL, as_json=True) == {
        "name": MODEL, "versions": ["1"], "platform": "onnxruntime_onnx",
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

