"""The fix_shapes step: symbolic dims made concrete by name or per input, errors that list names."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from temper.artifacts.core import onnx_io
from temper.artifacts.core.errors import OptionError, StepFailed
from temper.pipeline.step_options import FixShapesOptions
from temper.pipeline.steps.fix_shapes import FixShapes

STEP = FixShapes()


def _fix(src: Path, tmp_path: Path, ctx, **options) -> onnx.ModelProto:
    opts = FixShapesOptions(**options)
    STEP.validate(onnx_io.load_structure(src), opts)
    dst = tmp_path / "fixed.onnx"
    STEP.run(src, dst, opts, ctx)
    return onnx_io.load_structure(dst)


def _outputs(model: onnx.ModelProto) -> dict[str, list[int | str]]:
    return {
        o.name: [d.dim_value if d.HasField("dim_value") else d.dim_param for d in o.type.tensor_type.shape.dim]
        for o in model.graph.output
    }


def _hidden(*shape: int) -> dict[str, np.ndarray]:
    return {"hidden": np.random.default_rng(0).standard_normal(shape).astype(np.float32)}


def test_dims_by_name_make_inputs_and_outputs_concrete(
    tiny_transformer_like_path: Path, tmp_path: Path, make_context
) -> None:
    fixed = _fix(tiny_transformer_like_path, tmp_path, make_context({}), dims={"batch": 2, "seq": 8})
    assert onnx_io.dims(fixed) == {"hidden": [2, 8, 16]}
    assert _outputs(fixed) == {"out": [2, 8, 16]}
    batch = _hidden(2, 8, 16)
    expected = onnx_io.run(tiny_transformer_like_path, batch)[0]
    np.testing.assert_allclose(onnx_io.run(tmp_path / "fixed.onnx", batch)[0], expected, rtol=1e-5, atol=1e-6)


def test_fixing_only_batch_leaves_seq_symbolic(tiny_transformer_like_path: Path, tmp_path: Path, make_context) -> None:
    fixed = _fix(tiny_transformer_like_path, tmp_path, make_context({}), dims={"batch": 4})
    assert onnx_io.dims(fixed) == {"hidden": [4, "seq", 16]}
    assert _outputs(fixed) == {"out": [4, "seq", 16]}
    for seq in (3, 11):
        assert onnx_io.run(tmp_path / "fixed.onnx", _hidden(4, seq, 16))[0].shape == (4, seq, 16)


def test_per_input_shape(tiny_cnn_path: Path, tmp_path: Path, make_context) -> None:
    fixed = _fix(tiny_cnn_path, tmp_path, make_context({}), inputs={"pixels": [3, 1, 8, 8]})
    assert onnx_io.dims(fixed) == {"pixels": [3, 1, 8, 8]}
    assert _outputs(fixed) == {"out": [3, 10]}
    # Intermediate tensors get concrete shapes too (what later steps and runtimes plan with).
    assert all(d.HasField("dim_value") for v in fixed.graph.value_info for d in v.type.tensor_type.shape.dim)
    pixels = np.zeros((3, 1, 8, 8), np.float32)
    assert onnx_io.run(tmp_path / "fixed.onnx", {"pixels": pixels})[0].shape == (3, 10)


def test_external_data_input(tiny_cnn_path: Path, tmp_path: Path, make_context, external_data_copy) -> None:
    fixed = _fix(external_data_copy(tiny_cnn_path), tmp_path, make_context({}), dims={"batch": 2})
    assert onnx_io.dims(fixed) == {"pixels": [2, 1, 8, 8]}
    pixels = np.ones((2, 1, 8, 8), np.float32)
    expected = onnx_io.run(tiny_cnn_path, {"pixels": pixels})[0]
    np.testing.assert_allclose(onnx_io.run(tmp_path / "fixed.onnx", {"pixels": pixels})[0], expected, rtol=1e-6)


def test_unknown_dim_name_lists_the_real_ones(tiny_transformer_like_path: Path) -> None:
    with pytest.raises(OptionError) as err:
        STEP.validate(onnx_io.load_structure(tiny_transformer_like_path), FixShapesOptions(dims={"sequence": 128}))
    assert err.value.key == "dims.sequence"
    assert err.value.message == "no input has a dim named 'sequence'; symbolic dims in this model: batch, seq"


def test_unknown_input_name_lists_the_real_inputs(tiny_transformer_like_path: Path) -> None:
    options = FixShapesOptions(inputs={"input_ids": [1, 128]})
    with pytest.raises(OptionError, match=r"no model input named 'input_ids'; inputs: hidden$") as err:
        STEP.validate(onnx_io.load_structure(tiny_transformer_like_path), options)
    assert err.value.key == "inputs.input_ids"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"inputs": {"pixels": [1, 8, 8]}}, r"\[1, 8, 8\] has rank 3 but input 'pixels' is \[batch, 1, 8, 8\]"),
        ({"inputs": {"pixels": [1, 3, 8, 8]}}, r"axis 1 of 'pixels' is fixed at 1 in the model"),
        ({"dims": {"batch": 2}, "inputs": {"pixels": [4, 1, 8, 8]}}, r"dim 'batch', which dims.batch sets to 2, not 4"),
    ],
)
def test_shapes_that_contradict_the_model_are_option_errors(tiny_cnn_path: Path, options: dict, message: str) -> None:
    with pytest.raises(OptionError, match=message) as err:
        STEP.validate(onnx_io.load_structure(tiny_cnn_path), FixShapesOptions(**options))
    assert err.value.key == "inputs.pixels"


def test_size_the_graph_cannot_take_fails_the_step(tmp_path: Path, make_context) -> None:
    # x [batch, width] @ W [4, 3]: any width but 4 contradicts the weight.
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="proj")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "width"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
        [numpy_helper.from_array(np.ones((4, 3), np.float32), "w")],
    )
    src = tmp_path / "proj.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), str(src))
    with pytest.raises(StepFailed, match=r"^fix_shapes: the model contradicts the fixed shapes: .*proj"):
        STEP.run(src, tmp_path / "fixed.onnx", FixShapesOptions(dims={"width": 5}), make_context({}))


def test_the_placeholder_error_shows_this_models_input_name_and_rank() -> None:
    """The example in the '?' error is the model's own input, not one hard-coded for an OCR model."""
    image = helper.make_tensor_value_info("image", TensorProto.FLOAT, ["?", 3, "?", "?", 2])
    out = helper.make_tensor_value_info("out", TensorProto.FLOAT, None)
    model = helper.make_model(helper.make_graph([helper.make_node("Relu", ["image"], ["out"])], "g", [image], [out]))
    with pytest.raises(OptionError) as info:
        STEP.validate(model, FixShapesOptions(dims={"?": 48}))
    assert info.value.key == "dims.?"
    assert "inputs: {image: [N, 3, N, N, 2]}" in info.value.message
