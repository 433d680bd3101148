"""The gRPC side of Triton's extensions, which perf_analyzer and tritonclient read before they send a
request: ModelConfig and ModelStatistics (the same documents as REST's /config and /stats), the
repository RPCs of a server of one bundle, and NaN bit patterns in raw inputs reaching the model."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

grpc = pytest.importorskip("grpc")
tritongrpc = pytest.importorskip("tritonclient.grpc")
from google.protobuf import json_format  # noqa: E402
from tritonclient.grpc import model_config_pb2 as mc  # noqa: E402
from tritonclient.grpc import service_pb2 as pb  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

from temper.artifacts.serving.runtime import Runtime  # noqa: E402
from temper.artifacts.serving.triton_extensions import model_config, statistics  # noqa: E402
from tests.artifacts import grpc_servers  # noqa: E402
from tests.artifacts.grpc_servers import GrpcServed, _infer, _outputs, _raw_request  # noqa: E402
from tests.artifacts.servers import MODEL, _expected, _inputs  # noqa: E402

tiny, served, client = grpc_servers.tiny, grpc_servers.served, grpc_servers.client


def test_model_config_is_the_rest_document_as_protobuf(served: GrpcServed,
                                                       client: tritongrpc.InferenceServerClient) -> None:
    config = client.get_model_config(MODEL).config
    assert config == json_format.ParseDict(model_config(served.runtime), mc.ModelConfig())
    assert config.platform == "onnxruntime_onnx" and config.max_batch_size == 16
    assert [i.name for i in config.input] == ["x", "ids"] and list(config.input[0].dims) == [4]
    assert config.dynamic_batching.default_queue_policy.max_queue_size == served.runtime.config.max_queue


def test_model_statistics_count_what_was_served(served: GrpcServed, client: tritongrpc.InferenceServerClient) -> None:
    def stats() -> pb.InferStatistics:
        (model,) = client.get_inference_statistics(MODEL).model_stats
        return model

    before = stats()
    for seed in range(3):
        _infer(client, _inputs(seed))
    after = stats()
    assert after.name == MODEL and after.version == "1"
    assert after.inference_stats.success.count == before.inference_stats.success.count + 3
    assert after.inference_count == before.inference_count + 6  # 3 requests of 2 rows
    rest = statistics(served.runtime, 0)["model_stats"][0]  # what REST's /stats says, read now
    assert after.inference_stats.success.count == rest["inference_stats"]["success"]["count"]
    assert [b.batch_size for b in after.batch_stats] == [b["batch_size"] for b in rest["batch_stats"]]
    assert len(client.get_inference_statistics("").model_stats) == 1  # every model's: this one


def test_the_repository_is_the_one_model(client: tritongrpc.InferenceServerClient) -> None:
    """A server of one bundle is in model control mode none: load and unload answer UNAVAILABLE, as Triton's do
    (it answered OK for the served model and NOT_FOUND for others before repositories were served)."""
    index = client.get_model_repository_index(as_json=True)["models"]
    assert index == [{"name": MODEL, "version": "1", "state": "READY"}]
    for action, name in ((client.load_model, MODEL), (client.load_model, "other"), (client.unload_model, MODEL)):
        with pytest.raises(InferenceServerException) as refused:
            action(name)
        assert refused.value.status() == "StatusCode.UNAVAILABLE"
        assert "--model-control-mode explicit" in refused.value.message()
    assert client.is_model_ready(MODEL)


def test_nan_bit_patterns_in_raw_inputs_reach_the_model(served: GrpcServed, reference: ort.InferenceSession) -> None:
    """As Triton: binary tensors go to the model as they are (perf_analyzer's random data holds NaNs)."""
    inputs = _inputs(21)
    inputs["x"][0, 1] = np.nan
    inputs["x"][1] = np.frombuffer(np.array([0x7FC00001, 0xFF800000, 0, 0x3F800000], "<u4").tobytes(), "<f4")
    got = _outputs(served.stub.ModelInfer(_raw_request(inputs)))
    want = _expected(reference, inputs)
    np.testing.assert_array_equal(np.isnan(got["y"]), np.isnan(want["y"]))
    assert np.isnan(got["y"]).all() and np.array_equal(got["total"], want["total"])


def test_a_bundle_with_recorded_session_settings_serves_its_config_over_grpc(tmp_path) -> None:
    """Bundles `temper run` writes record their session settings, which Triton's ModelConfig holds as a map
    field; written as a list of key/value objects, ParseDict refused it and perf_analyzer -i grpc exited 99."""
    from temper.artifacts.engines.onnxruntime import SessionSettings
    from tests.artifacts.servers import _bundle, _tiny_model

    settings = SessionSettings(intra_op_threads=1, graph_optimization="extended")
    folder = _bundle(tmp_path / "bundle", _tiny_model(tmp_path / "tiny.onnx"), MODEL, max_batch_size=8,
                     session=settings)
    with grpc_servers.GrpcServed(Runtime(folder)) as served_here:
        c = served_here.client()
        config = c.get_model_config(MODEL).config
        c.close()
    assert dict(config.parameters) == {"intra_op_thread_count": mc.ModelParameter(string_value="1"),
                                       "execution_mode": mc.ModelParameter(string_value="0")}
    assert config.optimization.graph.level == 1
    document = model_config(served_here.runtime)
    assert document["parameters"] == {"intra_op_thread_count": {"string_value": "1"},
                                      "execution_mode": {"string_value": "0"}}
