"""A model repository over gRPC, through tritonclient: the repository index, load and unload RPCs in model control
modes explicit and none, readiness, and inference on each model against ONNX Runtime run directly."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

tritongrpc = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException  # noqa: E402 - after the skip when tritonclient is missing

from temper.artifacts.serving.grpc_server import GrpcServer  # noqa: E402
from temper.artifacts.serving.models import Models  # noqa: E402
from tests.artifacts.grpc_servers import _triton_inputs  # noqa: E402
from tests.artifacts.repositories import OTHER, models  # noqa: E402
from tests.artifacts.servers import MODEL, _expected, _inputs  # noqa: E402


@contextlib.contextmanager
def _serving(served: Models) -> Iterator[tritongrpc.InferenceServerClient]:
    server = GrpcServer(served, "127.0.0.1", 0)
    port = server.start()
    served.start()  # as `temper serve`: the gRPC port answers while the REST lifespan loads the models
    client = tritongrpc.InferenceServerClient(f"127.0.0.1:{port}")
    try:
        yield client
    finally:
        client.close()
        server.stop(grace_s=1)
        served.stop()


@pytest.fixture
def explicit(repo: Path) -> Iterator[tritongrpc.InferenceServerClient]:
    with _serving(models(repo, "explicit", [MODEL])) as client:
        yield client


def _check(client: tritongrpc.InferenceServerClient, name: str, refs: dict[str, ort.InferenceSession],
           version: str = "") -> tritongrpc.InferResult:
    inputs = _inputs(7)
    result = client.infer(name, _triton_inputs(inputs), model_version=version)
    want = _expected(refs[name], inputs)
    np.testing.assert_allclose(result.as_numpy("y"), want["y"], rtol=1e-6)
    assert np.array_equal(result.as_numpy("total"), want["total"])
    return result


def test_explicit_load_and_unload_through_tritonclient(explicit: tritongrpc.InferenceServerClient,
                                                        refs: dict[str, ort.InferenceSession]) -> None:
    c = explicit
    assert c.is_server_ready() and c.is_model_ready(MODEL) and not c.is_model_ready(OTHER)
    assert c.get_model_repository_index(as_json=True)["models"] == [
        {"name": OTHER}, {"name": MODEL, "version": "2", "state": "READY"}]
    assert _check(c, MODEL, refs).get_response().model_version == "2"
    with pytest.raises(InferenceServerException) as refused:
        _check(c, OTHER, refs)
    assert refused.value.status() == "StatusCode.NOT_FOUND" and "not loaded" in refused.value.message()

    c.load_model(OTHER)
    assert c.is_model_ready(OTHER) and c.get_model_metadata(OTHER).versions == ["1"]
    _check(c, OTHER, refs, version="1")
    (stats,) = c.get_inference_statistics(OTHER).model_stats
    assert stats.version == "1" and stats.inference_stats.success.count == 1
    assert len(c.get_inference_statistics("").model_stats) == 2

    c.unload_model(OTHER)
    assert not c.is_model_ready(OTHER) and c.is_server_ready()
    with pytest.raises(InferenceServerException) as refused:
        _check(c, OTHER, refs)
    assert refused.value.status() == "StatusCode.NOT_FOUND"
    index = c.get_model_repository_index(as_json=True)["models"]
    assert index[0] == {"name": OTHER, "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}
    with pytest.raises(InferenceServerException) as refused:
        c.load_model("nothing")
    assert refused.value.status() == "StatusCode.INVALID_ARGUMENT" and "no model 'nothing'" in refused.value.message()
    with pytest.raises(InferenceServerException) as refused:
        c.infer(MODEL, _triton_inputs(_inputs(1)), model_version="1")  # version 1 is in the repository, not served
    assert refused.value.status() == "StatusCode.NOT_FOUND"


def test_mode_none_loads_everything_and_refuses_control(repo: Path, refs: dict[str, ort.InferenceSession]) -> None:
    with _serving(models(repo)) as c:
        assert [m["state"] for m in c.get_model_repository_index(as_json=True)["models"]] == ["READY", "READY"]
        _check(c, MODEL, refs)
        _check(c, OTHER, refs)
        for action in (c.load_model, c.unload_model):
            with pytest.raises(InferenceServerException) as refused:
                action(OTHER)
            assert refused.value.status() == "StatusCode.UNAVAILABLE"
            assert "--model-control-mode explicit" in refused.value.message()
        assert c.is_model_ready(OTHER)
