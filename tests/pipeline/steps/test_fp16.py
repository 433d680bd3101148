"""The fp16 step: real float16 weights, FP32 io on request, blocked ops in FP32, overflow caught."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from temper.artifacts.core import onnx_io
from temper.artifacts.core.errors import OptionError, StepFailed
from temper.pipeline.step_options import Fp16Options
from temper.pipeline.steps.fp16 import Fp16

STEP = Fp16()


def _convert(src: Path, tmp_path: Path, ctx, **options) -> Path:
    opts = Fp16Options(**options)
    STEP.validate(onnx_io.load_structure(src), opts)
    dst = tmp_path / "half.onnx"
    STEP.run(src, dst, opts, ctx)
    return dst


def _float_model(tmp_path: Path, name: str, nodes: list, consts: dict[str, np.ndarray]) -> Path:
    """x [batch, 4] -> nodes -> y [batch, 4], float32 constants as initializers."""
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [numpy_helper.from_array(value.astype(np.float32), key) for key, value in consts.items()],
    )
    path = tmp_path / f"{name}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), str(path))
    return path


def _producers(model: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    return {out: node for node in model.graph.node for out in node.output}


def test_weights_become_float16_io_stays_float32(tiny_cnn_path: Path, tmp_path: Path, make_context) -> None:
    batch = {"pixels": np.random.default_rng(0).standard_normal((3, 1, 8, 8)).astype(np.float32)}
    dst = _convert(tiny_cnn_path, tmp_path, make_context(batch))
    model = onnx.load(str(dst))
    weights = {t.name: t.data_type for t in model.graph.initializer}
    assert weights and set(weights.values()) == {TensorProto.FLOAT16}
    assert [v.type.tensor_type.elem_type for v in (*model.graph.input, *model.graph.output)] == [TensorProto.FLOAT] * 2
    half, full = onnx_io.run(dst, batch)[0], onnx_io.run(tiny_cnn_path, batch)[0]
    assert half.dtype == np.float32
    np.testing.assert_allclose(half, full, rtol=1e-2, atol=1e-2)


def test_external_data_input(tiny_cnn_path: Path, tmp_path: Path, make_context, external_data_copy) -> None:
    batch = {"pixels": np.random.default_rng(3).standard_normal((2, 1, 8, 8)).astype(np.float32)}
    dst = _convert(external_data_copy(tiny_cnn_path), tmp_path, make_context(batch))
    assert {t.data_type for t in onnx.load(str(dst)).graph.initializer} == {TensorProto.FLOAT16}
    np.testing.assert_allclose(onnx_io.run(dst, batch)[0], onnx_io.run(tiny_cnn_path, batch)[0], rtol=1e-2, atol=1e-2)


def test_blocked_ops_run_in_float32(tiny_transformer_like_path: Path, tmp_path: Path, make_context) -> None:
    batch = {"hidden": np.random.default_rng(1).standard_normal((2, 6, 16)).astype(np.float32)}
    dst = _convert(tiny_transformer_like_path, tmp_path, make_context(batch),
                   op_block_list=["LayerNormalization", "Softmax"])
    model = onnx.load(str(dst))
    producers = _producers(model)
    types = {t.name: t.data_type for t in model.graph.initializer}
    for node in (n for n in model.graph.node if n.op_type in ("LayerNormalization", "Softmax")):
        for name in node.input:
            # Each float input is an FP32 weight or comes through a Cast to float.
            if name in types:
                assert types[name] == TensorProto.FLOAT
            else:
                cast = producers[name]
                assert cast.op_type == "Cast" and helper.get_attribute_value(cast.attribute[0]) == TensorProto.FLOAT
    assert any(t == TensorProto.FLOAT16 for t in types.values())  # the MatMuls' weights are half
    expected = onnx_io.run(tiny_transformer_like_path, batch)[0]
    np.testing.assert_allclose(onnx_io.run(dst, batch)[0], expected, rtol=1e-2, atol=1e-2)


def test_float16_io_when_not_kept(tiny_cnn_path: Path, tmp_path: Path, make_context) -> None:
    batch = {"pixels": np.random.default_rng(2).standard_normal((2, 1, 8, 8)).astype(np.float32)}
    dst = _convert(tiny_cnn_path, tmp_path, make_context(batch), keep_io_types=False)
    assert onnx_io.run(dst, {"pixels": batch["pixels"].astype(np.float16)})[0].dtype == np.float16


def test_overflow_past_65504_fails_and_the_suggested_block_list_fixes_it(tmp_path: Path, make_context) -> None:
    # big = x @ 300 reaches 4 * 100 * 300 = 120000: finite in FP32, Inf in FP16 (ORT's CPU
    # kernels would hide it: they compute in FP32); y = big / 1000 is back in range.
    src = _float_model(
        tmp_path,
        "overflow",
        [
            helper.make_node("MatMul", ["x", "c"], ["big"], name="mm"),
            helper.make_node("Mul", ["big", "s"], ["y"], name="shrink"),
        ],
        {"c": np.full((4, 4), 300.0), "s": np.array(1e-3)},
    )
    batch = {"x": np.full((2, 4), 100.0, np.float32)}
    expected = (r"^fp16: non-finite values \(NaN/Inf\) .* first in 'big', "
                r"output of node 'mm' \(MatMul\) \(8 of 8 values\)")
    with pytest.raises(StepFailed, match=expected + r".*node_block_list \['mm', 'shrink'\]"):
        _convert(src, tmp_path, make_context(batch))
    fixed = _convert(src, tmp_path, make_context(batch), node_block_list=["mm", "shrink"])
    np.testing.assert_allclose(onnx_io.run(fixed, batch)[0], 120.0, rtol=1e-3)


def test_input_past_65504(tmp_path: Path, make_context) -> None:
    src = _float_model(tmp_path, "shrink", [helper.make_node("Mul", ["x", "s"], ["y"], name="shrink")],
                       {"s": np.array(1e-3)})
    batch = {"x": np.full((2, 4), 1e6, np.float32)}
    with pytest.raises(StepFailed, match=r"the float16 copy of model input 'x'.*node_block_list \['shrink'\]"):
        _convert(src, tmp_path, make_context(batch))
    with pytest.raises(StepFailed,
                       match=r"^fp16: model input 'x' holds values past float16's 65504.*keep_io_types: true"):
        _convert(src, tmp_path, make_context(batch), keep_io_types=False)
    fixed = _convert(src, tmp_path, make_context(batch), node_block_list=["shrink"])
    np.testing.assert_allclose(onnx_io.run(fixed, batch)[0], 1000.0, rtol=1e-6)


def test_non_finite_already_in_float32_is_not_blamed_on_fp16(tmp_path: Path, make_context) -> None:
    src = _float_model(tmp_path, "div0", [helper.make_node("Div", ["x", "zero"], ["y"], name="div")],
                       {"zero": np.zeros(4)})
    batch = {"x": np.ones((2, 4), np.float32)}
    assert np.isinf(onnx_io.run(_convert(src, tmp_path, make_context(batch)), batch)[0]).all()


def test_unknown_node_name_suggests_close_ones(tiny_transformer_like_path: Path) -> None:
    options = Fp16Options(node_block_list=["/Softmax", "/norm/LayerNorm"])
    expected = r"node '/norm/LayerNorm' is not in the graph; closest: /norm/LayerNormalization"
    with pytest.raises(OptionError, match=expected) as err:
        STEP.validate(onnx_io.load_structure(tiny_transformer_like_path), options)
    assert err.value.key == "node_block_list[1]"


def test_misspelt_op_type_is_an_option_error(tiny_transformer_like_path: Path) -> None:
    with pytest.raises(OptionError, match=r"'Softmx' is not an ONNX op type.*did you mean 'Softmax'") as err:
        STEP.validate(onnx_io.load_structure(tiny_transformer_like_path),
                      Fp16Options(op_block_list=["Resize", "Softmx"]))
    assert err.value.key == "op_block_list[1]"
