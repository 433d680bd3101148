"""Request parameters as Triton reads them, over REST and gRPC alike: `timeout` (microseconds) is the
request's queue timeout, honoured; `priority` other than 0, an output's `class_count` and, while
client shared memory is off, shared memory outputs are refused in one line instead of being ignored."""

from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np
import pytest

grpc = pytest.importorskip("grpc")
from tritonclient.grpc import service_pb2 as pb  # noqa: E402

from temper.artifacts.serving.runtime import Runtime  # noqa: E402
from tests.artifacts.grpc_servers import GrpcServed  # noqa: E402
from tests.artifacts.servers import Client, Served, _bundle, _slow_model  # noqa: E402


@pytest.fixture(scope="module")
def slow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Client, GrpcServed, Runtime]]:
    """The slow model (never run inline, so every request passes the queue) on REST and gRPC."""
    root = tmp_path_factory.mktemp("slow")
    runtime = Runtime(_bundle(root / "bundle", _slow_model(root / "slow.onnx"), "slow", max_batch_size=4))
    with Served(runtime) as rest, GrpcServed(runtime, start_runtime=False) as rpc:
        client = Client(rest.port)
        yield client, rpc, runtime
        client.close()


def _rest(client: Client, parameters: dict | None = None, output: dict | None = None) -> tuple[int, str]:
    request: dict = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [0.5] * 4}]}
    if parameters is not None:
        request["parameters"] = parameters
    if output is not None:
        request["outputs"] = [{"name": "y", "parameters": output}]
    status, _, body = client.infer(request, model="slow")
    return status, body.decode()


def _rpc(served: GrpcServed, parameters: dict | None = None, output: dict | None = None) -> pb.ModelInferResponse:
    request = pb.ModelInferRequest(model_name="slow")
    request.inputs.add(name="x", datatype="FP32", shape=[1, 4])
    request.raw_input_contents.append(np.full((1, 4), 0.5, "<f4").tobytes())
    for key, value in (parameters or {}).items():
        request.parameters[key].int64_param = value
    if output is not None:
        wanted = request.outputs.add(name="y")
        for key, value in output.items():
            wanted.parameters[key].int64_param = value
    return served.stub.ModelInfer(request, timeout=60)


def test_a_queue_timeout_shorter_than_the_wait_drops_the_request_unrun(
        slow: tuple[Client, GrpcServed, Runtime]) -> None:
    client, rpc, runtime = slow
    before = runtime.metrics.snapshot()
    status, body = _rest(client, {"timeout": 1})  # 1 µs: past before the batcher takes it
    assert status == 504 and "Request timeout expired" in json.loads(body)["error"], body
    with pytest.raises(grpc.RpcError) as refused:
        _rpc(rpc, {"timeout": 1})
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE and "Request timeout expired" in refused.value.details()
    after = runtime.metrics.snapshot()
    assert after["execution_count"] == before["execution_count"]  # never computed
    assert after["failures"]["REJECTED"] == before["failures"]["REJECTED"] + 2
    assert _rest(client, {"timeout": 30_000_000})[0] == 200 and _rpc(rpc, {"timeout": 0}).outputs[0].shape == [1, 1]


@pytest.mark.parametrize(("parameters", "output", "message"), [
    ({"priority": 2}, None, "no priority levels"),
    ({"timeout": -5}, None, "parameters.timeout must be a non-negative integer"),
    (None, {"class_count": 3}, "class_count (Triton's classification extension) is not supported"),
    (None, {"classification": 3}, "classification (Triton's classification extension) is not supported"),
    (None, {"shared_memory_region": 1}, "client shared memory is off; start temper serve with --allow-client-shm"),
])
def test_what_would_be_ignored_is_refused_in_one_line(slow: tuple[Client, GrpcServed, Runtime],
                                                      parameters: dict | None, output: dict | None,
                                                      message: str) -> None:
    client, rpc, _ = slow
    status, body = _rest(client, parameters, output)
    assert status == 400 and message in json.loads(body)["error"], body
    with pytest.raises(grpc.RpcError) as refused:
        _rpc(rpc, parameters, output)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and message in refused.value.details()
    assert _rest(client, {"priority": 0})[0] == 200
