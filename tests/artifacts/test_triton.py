"""The Triton repository export, checked against Triton's own ModelConfig protobuf schema and
against ONNX Runtime running the warm-up requests the config declares."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from google.protobuf import text_format
from onnx import TensorProto, helper, numpy_helper

from temper.artifacts.formats.bundle import config_for, write
from temper.artifacts.triton.config import WARMUP_DIM, export_repository

model_config_pb2 = pytest.importorskip(
    "tritonclient.grpc.model_config_pb2", reason="Triton's ModelConfig schema comes with tritonclient[grpc] (dev extra)"
)
pb = model_config_pb2

WEIGHTS = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)


def save(folder: Path, nodes: list, inputs: list, outputs: list, initializers: list = (), **save_args) -> Path:
    model = helper.make_model(
        helper.make_graph(nodes, "g", inputs, outputs, list(initializers)), opset_imports=[helper.make_opsetid("", 17)]
    )
    model.ir_version = 9
    onnx.checker.check_model(model)
    folder.mkdir(parents=True)
    path = folder / "model.onnx"
    onnx.save_model(model, str(path), **save_args)
    return path


def linear(folder: Path, batch: str | int = "batch", **save_args) -> Path:
    """y = x @ W, float32, batch dim symbolic (or fixed)."""
    return save(
        folder, [helper.make_node("MatMul", ["x", "W"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 3])],
        [numpy_helper.from_array(WEIGHTS, "W")], **save_args,
    )


def text_model(folder: Path) -> Path:
    """input_ids/attention_mask int64 [batch, seq] -> masked ids [batch, seq] and per-row token count [batch]."""
    return save(
        folder,
        [
            helper.make_node("Mul", ["input_ids", "attention_mask"], ["masked"]),
            helper.make_node("ReduceSum", ["attention_mask", "axis"], ["tokens"], keepdims=0),
        ],
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"]),
        ],
        [
            helper.make_tensor_value_info("masked", TensorProto.INT64, ["batch", "seq"]),
            helper.make_tensor_value_info("tokens", TensorProto.INT64, ["batch"]),
        ],
        [numpy_helper.from_array(np.array([1], dtype=np.int64), "axis")],
    )


def make_bundle(tmp_path: Path, model: Path, name: str, **serving) -> Path:
    return write(tmp_path / "bundle", model, config_for(model, name, **serving))


def parse(folder: Path) -> pb.ModelConfig:
    """Parse config.pbtxt with Triton's own schema: unknown fields, wrong types or bad enum values raise."""
    return text_format.Parse((folder / "config.pbtxt").read_text(), pb.ModelConfig())


def run_warmups(config: pb.ModelConfig, model: Path) -> None:
    """Send each declared warm-up request to ONNX Runtime the way Triton would build it."""
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    inputs = {io.name: io for io in config.input}
    dtypes = {pb.TYPE_FP32: np.float32, pb.TYPE_INT64: np.int64}
    for warmup in config.model_warmup:
        feed = {}
        for name, data in warmup.inputs.items():
            assert data.zero_data and list(data.dims) == [WARMUP_DIM if d == -1 else d for d in inputs[name].dims]
            shape = list(inputs[name].reshape.shape) if inputs[name].HasField("reshape") else list(data.dims)
            if config.max_batch_size > 0:
                shape = [warmup.batch_size, *shape]
            feed[name] = np.zeros(shape, dtype=dtypes[data.data_type])
        outputs = session.run(None, feed)
        if config.max_batch_size > 0:
            assert all(out.shape[0] == warmup.batch_size for out in outputs)


def test_float_model_config_parses_against_triton_schema(tmp_path: Path) -> None:
    serving = {"max_batch_size": 32, "max_delay_ms": 2.5, "max_queue": 64}
    bundle = make_bundle(tmp_path, linear(tmp_path / "src"), "digits", **serving)
    folder = export_repository(bundle, tmp_path / "repo", instances=2, kind="KIND_GPU")
    config = parse(folder)

    assert folder == tmp_path / "repo" / "digits"
    assert config.name == "digits"
    assert config.platform == "onnxruntime_onnx"
    assert config.max_batch_size == 32
    assert [(io.name, io.data_type, list(io.dims)) for io in config.input] == [("x", pb.TYPE_FP32, [4])]
    assert [(io.name, io.data_type, list(io.dims)) for io in config.output] == [("y", pb.TYPE_FP32, [3])]

    batching = config.dynamic_batching
    assert config.WhichOneof("scheduling_choice") == "dynamic_batching"
    assert list(batching.preferred_batch_size) == [32]
    assert batching.max_queue_delay_microseconds == 2500
    assert batching.default_queue_policy.max_queue_size == 64
    assert batching.default_queue_policy.default_timeout_microseconds == 30_000_000
    assert batching.default_queue_policy.timeout_action == pb.ModelQueuePolicy.REJECT

    assert [(g.count, g.kind) for g in config.instance_group] == [(2, pb.ModelInstanceGroup.KIND_GPU)]

    assert [(w.name, w.batch_size) for w in config.model_warmup] == [("batch_1", 1), ("batch_32", 32)]
    for warmup in config.model_warmup:
        assert set(warmup.inputs) == {"x"}
        assert warmup.inputs["x"].data_type == pb.TYPE_FP32
        assert list(warmup.inputs["x"].dims) == [4]
        assert warmup.inputs["x"].WhichOneof("input_data_type") == "zero_data"
    run_warmups(config, folder / "1" / "model.onnx")


def test_text_model_keeps_dynamic_dims_and_int64(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path, text_model(tmp_path / "src"), "minilm", pad={"input_ids": 0, "attention_mask": 0})
    folder = export_repository(bundle, tmp_path / "repo")
    config = parse(folder)

    assert config.max_batch_size == 16  # ServingConfig's default
    assert [(io.name, io.data_type, list(io.dims)) for io in config.input] == [
        ("input_ids", pb.TYPE_INT64, [-1]),
        ("attention_mask", pb.TYPE_INT64, [-1]),
    ]
    masked, tokens = config.output
    assert (masked.name, masked.data_type, list(masked.dims)) == ("masked", pb.TYPE_INT64, [-1])
    # A [batch] output has no dims left once the batch dim goes: Triton's spelling is dims [1]
    # reshaped to [] (one element per request).
    assert (tokens.name, list(tokens.dims), tokens.HasField("reshape"), list(tokens.reshape.shape)) == (
        "tokens", [1], True, [],
    )
    assert config.instance_group[0].kind == pb.ModelInstanceGroup.KIND_AUTO
    assert config.instance_group[0].count == 1
    assert config.dynamic_batching.max_queue_delay_microseconds == 10_000

    # The dynamic sequence dim gets a concrete warm-up size; zeros are valid token ids.
    for warmup in config.model_warmup:
        assert {name: list(data.dims) for name, data in warmup.inputs.items()} == {
            "input_ids": [WARMUP_DIM],
            "attention_mask": [WARMUP_DIM],
        }
        assert all(data.zero_data and data.data_type == pb.TYPE_INT64 for data in warmup.inputs.values())
    assert [w.batch_size for w in config.model_warmup] == [1, 16]
    run_warmups(config, folder / "1" / "model.onnx")


def test_a_per_request_scalar_input_is_reshaped(tmp_path: Path) -> None:
    """A [batch] input has no dims left once the batch dim goes: dims [1] reshaped to []."""
    model = save(
        tmp_path / "src", [helper.make_node("Neg", ["score"], ["negated"])],
        [helper.make_tensor_value_info("score", TensorProto.FLOAT, ["batch"])],
        [helper.make_tensor_value_info("negated", TensorProto.FLOAT, ["batch"])],
    )
    folder = export_repository(make_bundle(tmp_path, model, "scalar", max_batch_size=4), tmp_path / "repo")
    config = parse(folder)

    (score,) = config.input
    assert (list(score.dims), score.HasField("reshape"), list(score.reshape.shape)) == ([1], True, [])
    assert [(w.batch_size, list(w.inputs["score"].dims)) for w in config.model_warmup] == [(1, [1]), (4, [1])]
    run_warmups(config, folder / "1" / "model.onnx")


def test_repository_layout_copies_the_bundle_model_byte_for_byte(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path, linear(tmp_path / "src"), "digits")
    folder = export_repository(bundle, tmp_path / "repo")

    assert sorted(str(p.relative_to(tmp_path / "repo")) for p in (tmp_path / "repo").rglob("*")) == [
        "digits", "digits/.temper-output", "digits/1", "digits/1/model.onnx", "digits/1/runtime.json",
        "digits/config.pbtxt",
    ]
    assert (folder / "1" / "model.onnx").read_bytes() == (bundle / "model.onnx").read_bytes()


def test_external_data_travels_with_the_model(tmp_path: Path) -> None:
    model = linear(tmp_path / "src", save_as_external_data=True, location="model.onnx.data", size_threshold=0)
    bundle = make_bundle(tmp_path, model, "digits")
    folder = export_repository(bundle, tmp_path / "repo")

    assert sorted(p.name for p in (folder / "1").iterdir()) == ["model.onnx", "model.onnx.data", "runtime.json"]
    assert (folder / "1" / "model.onnx.data").read_bytes() == (bundle / "model.onnx.data").read_bytes()
    x = np.ones((2, 4), dtype=np.float32)
    session = ort.InferenceSession(str(folder / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    (y,) = session.run(None, {"x": x})
    np.testing.assert_allclose(y, x @ WEIGHTS, rtol=1e-6)


def test_missing_external_data_is_named(tmp_path: Path) -> None:
    model = linear(tmp_path / "src", save_as_external_data=True, location="model.onnx.data", size_threshold=0)
    bundle = make_bundle(tmp_path, model, "digits")
    (bundle / "model.onnx.data").unlink()
    with pytest.raises(FileNotFoundError, match="model.onnx.data"):
        export_repository(bundle, tmp_path / "repo")
    assert not (tmp_path / "repo" / "digits").exists()


def test_fixed_batch_dim_means_no_batching(tmp_path: Path) -> None:
    """A model traced at batch 1 cannot take a batch: Triton's max_batch_size 0, dims include the
    batch dim, no dynamic batcher, and one warm-up request of batch 1."""
    bundle = make_bundle(tmp_path, linear(tmp_path / "src", batch=1), "digits", max_batch_size=32)
    folder = export_repository(bundle, tmp_path / "repo", kind="KIND_CPU")
    config = parse(folder)

    assert config.max_batch_size == 0
    assert [list(io.dims) for io in config.input] == [[1, 4]]
    assert [list(io.dims) for io in config.output] == [[1, 3]]
    assert config.WhichOneof("scheduling_choice") is None
    assert config.instance_group[0].kind == pb.ModelInstanceGroup.KIND_CPU
    assert [(w.batch_size, list(w.inputs["x"].dims)) for w in config.model_warmup] == [(1, [1, 4])]
    run_warmups(config, folder / "1" / "model.onnx")


def test_a_batch_off_axis_0_or_a_constant_input_means_no_batching_and_one_line_why(tmp_path: Path) -> None:
    """Silero's layout: state [2, batch, 128] and a constant sr []. Triton batches on axis 0 only and
    knows no default values: max_batch_size 0, full dims, sr reshaped from [1], no zero warm-up."""
    from temper.artifacts.core.layout import Layout
    from temper.artifacts.triton.config import no_batching
    from tests.artifacts.runtimes import vad_model

    model = vad_model(tmp_path / "src")
    layout = Layout({"audio": 0, "sr": None, "state": 1}, {"prob": 0, "stateN": 1}, {"sr": np.array(16000)})
    bundle = write(tmp_path / "bundle", model, config_for(model, "vad", layout))
    folder = export_repository(bundle, tmp_path / "repo")
    config = parse(folder)
    assert config.max_batch_size == 0 and config.WhichOneof("scheduling_choice") is None
    assert [(io.name, list(io.dims), list(io.reshape.shape)) for io in config.input] == [
        ("audio", [-1, 64], []), ("sr", [1], []), ("state", [2, -1, 128], [])]
    assert config.input[1].HasField("reshape") and not config.model_warmup
    assert no_batching(config_for(model, "vad", layout)) == (
        "state holds its rows on axis 1; stateN holds its rows on axis 1; sr (16000) is not batched: Triton "
        "batches on axis 0 only, so the model is exported with max_batch_size 0 (each request runs as sent, "
        "no dynamic batching); clients send sr (16000) with every request")
    assert no_batching(config_for(linear(tmp_path / "plain"), "plain")) is None


def test_a_tensorrt_plan_is_served_instead_of_the_onnx_model(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path, linear(tmp_path / "src"), "digits")
    (bundle / "model.plan").write_bytes(b"engine bytes")
    folder = export_repository(bundle, tmp_path / "repo")

    assert parse(folder).platform == "tensorrt_plan"
    assert sorted(p.name for p in (folder / "1").iterdir()) == ["model.plan", "runtime.json"]
    assert (folder / "1" / "model.plan").read_bytes() == b"engine bytes"
    with pytest.raises(ValueError, match="GPU"):
        export_repository(bundle, tmp_path / "repo", kind="KIND_CPU")


def test_reexport_replaces_the_model_folder(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path, linear(tmp_path / "src"), "digits")
    folder = export_repository(bundle, tmp_path / "repo")
    (folder / "1" / "stale.onnx.data").write_bytes(b"old")
    runtime = bundle / "runtime.json"
    runtime.write_text(runtime.read_text().replace('"max_batch_size": 16', '"max_batch_size": 8'))

    assert export_repository(bundle, tmp_path / "repo") == folder
    assert parse(folder).max_batch_size == 8
    assert not (folder / "1" / "stale.onnx.data").exists()
    assert sorted(p.name for p in (tmp_path / "repo").iterdir()) == ["digits"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"kind": "KIND_TPU"}, "KIND_TPU"), ({"kind": "KIND_MODEL"}, "KIND_MODEL"), ({"instances": 0}, "instances")],
)
def test_bad_arguments_are_refused(tmp_path: Path, kwargs: dict, message: str) -> None:
    bundle = make_bundle(tmp_path, linear(tmp_path / "src"), "digits")
    with pytest.raises(ValueError, match=message):
        export_repository(bundle, tmp_path / "repo", **kwargs)


def test_a_name_that_is_not_a_folder_name_is_refused(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path, linear(tmp_path / "src"), "team/digits")
    with pytest.raises(ValueError, match="team/digits"):
        export_repository(bundle, tmp_path / "repo")
