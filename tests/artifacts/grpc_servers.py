"""The gRPC serving tests' harness: a GrpcServer on a free loopback port, its fixtures (the tiny model's
bundle with max_batch_size 16, the server, a tritonclient.grpc client) and request helpers. Test
modules bind the fixtures by name, over conftest.py's HTTP ones: `tiny = grpc_servers.tiny`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

grpc = pytest.importorskip("grpc")
tritongrpc = pytest.importorskip("tritonclient.grpc")
from tritonclient.grpc import service_pb2 as pb  # noqa: E402 - after the skip when tritonclient is missing
from tritonclient.grpc import service_pb2_grpc as pb_grpc  # noqa: E402

from temper.artifacts.serving.grpc_server import GrpcServer  # noqa: E402
from temper.artifacts.serving.runtime import Runtime  # noqa: E402
from tests.artifacts.servers import MODEL, _bundle, _tiny_model  # noqa: E402


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
def served(tiny: Path) -> Iterator[GrpcServed]:
    with GrpcServed(Runtime(tiny)) as s:
        yield s


@pytest.fixture
def client(served: GrpcServed) -> Iterator[tritongrpc.InferenceServerClient]:
    c = served.client()
    yield c
    c.close()


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

