"""The quantize step on tiny real models, with real ONNX Runtime sessions (ORT backend)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, QuantFormat, quantize_static

from temper.artifacts.core import onnx_io
from temper.artifacts.core.errors import OptionError, RecipeError, StepFailed
from temper.artifacts.core.onnx_io import Batch
from temper.pipeline.quantize_backends import OrtOptions, quantize_options
from temper.pipeline.steps.base import StepContext
from tests.pipeline.steps.quantize_models import (
    FLOAT_OPS,
    STEP,
    activation_scales,
    context,
    conv_net,
    float_node,
    gemm_mlp,
    heavy_tailed,
    images,
    initializers,
    ops,
    outputs_close,
    producers,
    quantize,
    save_model,
)

# 1. dynamic


def test_dynamic_quantizes_weights_to_int8_and_stays_close(tmp_path: Path) -> None:
    src = conv_net(tmp_path / "net.onnx")
    model = quantize(src, tmp_path, mode="dynamic")

    assert {"DynamicQuantizeLinear", "ConvInteger", "MatMulInteger"} <= set(ops(model))
    assert not FLOAT_OPS & set(ops(model)), "every Conv/MatMul should be integer"
    inits = initializers(model)
    assert inits["w1_quantized"].dtype == np.int8 and inits["wf_quantized"].dtype == np.int8
    assert outputs_close(src, model, tmp_path, images(99)) > 0.99


def test_dynamic_per_channel_gives_one_scale_per_output_column(tmp_path: Path) -> None:
    src = conv_net(tmp_path / "net.onnx")
    per_tensor = initializers(quantize(src, tmp_path, name="tensor", mode="dynamic"))
    per_channel = initializers(quantize(src, tmp_path, name="channel", mode="dynamic", per_channel=True))

    assert per_tensor["wf_scale"].size == 1
    assert per_channel["wf_scale"].shape == (10,)
    # ONNX Runtime's ConvInteger has per-tensor weights only: per_channel leaves convs alone.
    assert per_channel["w2_scale"].size == 1


def test_dynamic_quantizes_gemm_and_honours_uint8_weights(tmp_path: Path) -> None:
    src = gemm_mlp(tmp_path / "mlp.onnx")
    ctx = context(tmp_path, [], sample={"x": np.random.default_rng(5).normal(0, 1, (8, 100)).astype(np.float32)})
    model = quantize(src, tmp_path, ctx, mode="dynamic", weight_type="uint8")

    assert ops(model).count("MatMulInteger") == 2 and "Gemm" not in ops(model)
    assert all(a.dtype == np.uint8 for name, a in initializers(model).items() if name.endswith("_quantized"))
    assert outputs_close(src, model, tmp_path, ctx.sample()) > 0.99


# 2. static


def test_static_qdq_has_int8_weights_and_stays_close(tmp_path: Path) -> None:
    src = conv_net(tmp_path / "net.onnx")
    model = quantize(src, tmp_path, mode="static")

    assert {"QuantizeLinear", "DequantizeLinear"} <= set(ops(model))
    inits = initializers(model)
    assert inits["w1_quantized"].dtype == np.int8 and inits["w2_quantized"].dtype == np.int8
    made_by = producers(model)
    for node in model.graph.node:
        if node.op_type in FLOAT_OPS:  # the float op runs on dequantized tensors
            assert made_by[node.input[0]].op_type == "DequantizeLinear"
            assert made_by[node.input[1]].op_type == "DequantizeLinear"
    assert outputs_close(src, model, tmp_path, images(99)) > 0.99


def test_static_qoperator_uses_integer_ops_without_qdq_pairs(tmp_path: Path) -> None:
    src = conv_net(tmp_path / "net.onnx")
    model = quantize(src, tmp_path, mode="static", format="qoperator")

    assert ops(model).count("QLinearConv") == 2
    assert {"QGemm", "QLinearMatMul"} & set(ops(model))  # quant_pre_process fuses MatMul + Add into Gemm
    assert not FLOAT_OPS & set(ops(model))
    made_by = producers(model)
    dequantized = [made_by.get(n.input[0]) for n in model.graph.node if n.op_type == "DequantizeLinear"]
    assert not [node for node in dequantized if node is not None and node.op_type == "QuantizeLinear"]
    assert outputs_close(src, model, tmp_path, images(99)) > 0.99


# 3. calibration methods


class _Reader(CalibrationDataReader):
    def __init__(self, batches: list[Batch]) -> None:
        self._batches = iter(batches)

    def get_next(self) -> Batch | None:
        return next(self._batches, None)


@pytest.mark.slow
def test_calibration_methods_give_different_ranges(tmp_path: Path) -> None:
    src = conv_net(tmp_path / "net.onnx")
    ctx = context(tmp_path, [heavy_tailed(seed) for seed in range(4)])
    scales = {
        method: activation_scales(quantize(src, tmp_path, ctx, name=method, mode="static", calibration=method))
        for method in ("minmax", "entropy", "percentile")
    }

    for tensor in ("x", "r1"):
        minmax, entropy, percentile = (scales[m][tensor] for m in ("minmax", "entropy", "percentile"))
        assert entropy < minmax and percentile < minmax, "both clip the rare large values that MinMax keeps"
        assert not np.isclose(entropy, percentile)


@pytest.mark.slow
def test_library_entropy_gives_minmax_scales_which_is_why_we_calibrate_ourselves(tmp_path: Path) -> None:
    """onnxruntime 1.32 quantize_static never passes num_bins to its Entropy calibrator (128 bins for
    128 quantized bins: the only candidate threshold is the whole range), so Entropy == MinMax."""
    src = conv_net(tmp_path / "net.onnx")
    batches = [heavy_tailed(seed) for seed in range(4)]
    library = {}
    for method in (CalibrationMethod.MinMax, CalibrationMethod.Entropy):
        out = tmp_path / f"library_{method.name}.onnx"
        quantize_static(str(src), str(out), _Reader(batches), calibrate_method=method, quant_format=QuantFormat.QDQ)
        library[method] = activation_scales(onnx.load(str(out)))
    ours = {
        method: activation_scales(
            quantize(src, tmp_path, context(tmp_path, batches), name=method, mode="static", calibration=method)
        )
        for method in ("minmax", "entropy")
    }

    assert library[CalibrationMethod.Entropy] == library[CalibrationMethod.MinMax]
    assert ours["minmax"]["x"] == pytest.approx(library[CalibrationMethod.MinMax]["x"])
    assert ours["entropy"]["x"] < 0.8 * ours["minmax"]["x"]


# 4. exclusions


def test_static_excluded_nodes_stay_float(tmp_path: Path) -> None:
    src = conv_net(tmp_path / "net.onnx")
    model = quantize(src, tmp_path, mode="static", exclude_nodes=["conv2", "fc"])

    assert float_node(model, "conv2", "Conv", "w2")
    # quant_pre_process fused MatMul `fc` with its Add into Gemm `fc/MatMulAddFusion`: the exclusion follows it.
    assert float_node(model, "fc/MatMulAddFusion", "Gemm", "wf")
    assert initializers(model)["w1_quantized"].dtype == np.int8, "conv1 is still quantized"


def test_static_excluded_op_type_survives_fusion(tmp_path: Path) -> None:
    src = conv_net(tmp_path / "net.onnx")
    model = quantize(src, tmp_path, mode="static", exclude_op_types=["MatMul"])

    assert float_node(model, "fc/MatMulAddFusion", "Gemm", "wf")
    assert "w1_quantized" in initializers(model)


def test_static_exclusion_of_a_node_fused_away_is_refused(tmp_path: Path) -> None:
    src = conv_net(tmp_path / "net.onnx")
    with pytest.raises(OptionError) as err:
        quantize(src, tmp_path, mode="static", exclude_nodes=["conv1", "fc_bias"])
    assert err.value.key == "exclude_nodes[1]" and "quant_pre_process" in err.value.message


def test_dynamic_excluded_gemm_stays_float(tmp_path: Path) -> None:
    src = gemm_mlp(tmp_path / "mlp.onnx")
    ctx = context(tmp_path, [], sample={"x": np.ones((2, 100), np.float32)})
    by_name = quantize(src, tmp_path, ctx, name="by_name", mode="dynamic", exclude_nodes=["fc2"])
    assert ops(by_name).count("MatMulInteger") == 1
    # both Gemms excluded by type: the graph keeps no quantized node, which fails the build
    with pytest.raises(StepFailed, match=r"quantize wrote no quantized node \(0 of 2 eligible\)"):
        quantize(src, tmp_path, ctx, name="by_type", mode="dynamic", exclude_op_types=["Gemm"])


def test_unknown_node_name_is_an_option_error_with_the_closest_name(tmp_path: Path) -> None:
    model = onnx_io.load_structure(conv_net(tmp_path / "net.onnx"))
    with pytest.raises(OptionError) as err:
        STEP.validate(model, OrtOptions(mode="static", exclude_nodes=["conv1", "conv_2"]))
    assert err.value.key == "exclude_nodes[1]"
    assert "'conv_2' is not in the graph" in err.value.message and "closest: conv2" in err.value.message

    with pytest.raises(OptionError) as err:
        STEP.validate(model, OrtOptions(mode="static", exclude_nodes=["zzz"]))
    assert "it has: conv1, relu1" in err.value.message


def test_unknown_op_type_is_an_option_error(tmp_path: Path) -> None:
    model = onnx_io.load_structure(conv_net(tmp_path / "net.onnx"))
    with pytest.raises(OptionError) as err:
        STEP.validate(model, OrtOptions(mode="dynamic", exclude_op_types=["Convv"]))
    assert err.value.key == "exclude_op_types[0]" and "closest: Conv" in err.value.message


@pytest.mark.parametrize(
    ("options", "key"),
    [
        ({"mode": "static", "activation_type": "int8", "weight_type": "uint8"}, "weight_type"),
        ({"mode": "static", "calibration": "entropy", "num_bins": 128}, "num_bins"),
        ({"mode": "static", "backend": "modelopt", "calibration": "percentile"}, "calibration"),
        ({"mode": "static", "backend": "modelopt", "activation_type": "uint8"}, "activation_type"),
        # the preset is what the user wrote, not the uint8 activations it fills in
        ({"mode": "static", "backend": "modelopt", "preset": "avx2"}, "preset"),
    ],
)
def test_options_the_backend_cannot_honour_are_refused(tmp_path: Path, options: dict, key: str) -> None:
    model = onnx_io.load_structure(conv_net(tmp_path / "net.onnx"))
    with pytest.raises(OptionError) as err:
        STEP.validate(model, quantize_options(options))
    assert err.value.key == key


# 5. calibration data


def test_calibration_comes_from_the_context_not_the_sample(tmp_path: Path) -> None:
    src = conv_net(tmp_path / "net.onnx")
    calibration = {"x": np.linspace(-4, 4, 16 * 100, dtype=np.float32).reshape(16, 1, 10, 10)}
    sample = {"x": np.full((4, 1, 10, 10), 0.5, np.float32)}
    model = quantize(src, tmp_path, context(tmp_path, [calibration], sample), mode="static")

    assert activation_scales(model)["x"] == pytest.approx(8 / 255)


def test_every_calibration_sample_counts_with_a_fixed_batch_dim(tmp_path: Path) -> None:
    src = conv_net(tmp_path / "net.onnx", batch=2)
    calibration = {"x": np.zeros((8, 1, 10, 10), np.float32)}
    calibration["x"][7, 0, 0, 0], calibration["x"][6, 0, 0, 0] = 10.0, -10.0  # only in the last 2-sample chunk
    model = quantize(src, tmp_path, context(tmp_path, [calibration], images(1, rows=2)), mode="static")

    assert activation_scales(model)["x"] == pytest.approx(20 / 255)


def test_calibration_in_parts_keeps_the_ranges_of_the_whole_batch(tmp_path: Path) -> None:
    """Calibration runs a few rows per call to bound its memory (every tensor is an output): the
    extremes sit in different parts of one 32-row batch, and the range still spans both."""
    src = conv_net(tmp_path / "net.onnx")
    calibration = {"x": np.zeros((32, 1, 10, 10), np.float32)}
    calibration["x"][0, 0, 0, 0], calibration["x"][31, 0, 0, 0] = -6.0, 6.0
    model = quantize(src, tmp_path, context(tmp_path, [calibration]), mode="static")

    assert activation_scales(model)["x"] == pytest.approx(12 / 255)


def test_a_fixed_batch_model_calibrates_on_whole_batches(tmp_path: Path) -> None:
    src = conv_net(tmp_path / "net.onnx", batch=16)  # more rows than a calibration call takes
    calibration = {"x": np.zeros((16, 1, 10, 10), np.float32)}
    calibration["x"][15, 0, 0, 0] = 4.0
    model = quantize(src, tmp_path, context(tmp_path, [calibration], images(1, rows=16)), mode="static")

    assert activation_scales(model)["x"] == pytest.approx(4 / 255)


def test_calibration_errors_propagate(tmp_path: Path) -> None:
    def no_data() -> list[Batch]:
        raise RecipeError("recipe.yaml", "data.calibration", "no calibration data")

    src = conv_net(tmp_path / "net.onnx")
    ctx = StepContext(inputs=[], calibration=no_data, sample=lambda: images(0), scratch=tmp_path)
    with pytest.raises(RecipeError, match="no calibration data"):
        STEP.run(src, tmp_path / "q.onnx", OrtOptions(mode="static"), ctx)


# failures


def test_library_failure_is_one_step_failed_line(tmp_path: Path) -> None:
    src = conv_net(tmp_path / "net.onnx")
    float64 = {"x": images(0)["x"].astype(np.float64)}  # the calibration session rejects it
    with pytest.raises(StepFailed) as err:
        quantize(src, tmp_path, context(tmp_path, [float64], images(0)), mode="static")
    message = str(err.value)
    assert message.startswith("quantize: calibration failed: ")  # the stage, not just the library
    assert "\n" not in message and "Traceback" not in message


def test_nan_output_fails_the_step(tmp_path: Path) -> None:
    """y = Log(x @ W): negative products give NaN, which the check after quantizing must catch."""
    w = numpy_helper.from_array(np.random.default_rng(2).normal(0, 1, (100, 10)).astype(np.float32), "w")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"], name="fc"),
        helper.make_node("Log", ["m"], ["y"], name="log"),
    ]
    src = save_model(nodes, [w], ["batch", 100], ["batch", 10], tmp_path / "log.onnx")
    sample = {"x": np.random.default_rng(3).normal(0, 1, (4, 100)).astype(np.float32)}
    with pytest.raises(StepFailed, match="output 'y' of the quantized model has NaN/Inf"):
        quantize(src, tmp_path, context(tmp_path, [], sample), mode="dynamic")


def test_a_range_histograms_cannot_bin_is_found_from_the_minmax_ranges_before_calibrating(tmp_path: Path) -> None:
    """The fallback's percentile configuration is skipped from the MinMax ranges it has (quantize_static.
    unbinnable) instead of holding a whole batch of activations only for ORT's histogram to refuse the
    range: the two agree, on a tensor holding -inf (an attention mask's) and on one without."""
    from temper.pipeline.quantize_backends import quantize_static

    src = conv_net(tmp_path / "net.onnx")
    finite = images(0)
    masked = {"x": finite["x"].copy()}
    masked["x"][0, 0, 0, 0] = -np.inf
    for name, batch, refused in (("finite", finite, False), ("masked", masked, True)):
        scratch = tmp_path / name
        scratch.mkdir()
        minmax = quantize_static.prepare(src, OrtOptions(mode="static", preset=None), [batch], scratch, False)
        why = quantize_static.unbinnable(minmax, "percentile")
        (scratch / "p").mkdir()
        percentile = OrtOptions(mode="static", preset=None, calibration="percentile")
        if refused:
            assert why is not None and "tensor '" in why and "not finite" in why, why
            with pytest.raises(StepFailed, match="not finite"):
                quantize_static.prepare(src, percentile, [batch], scratch / "p", False)
        else:
            assert why is None
            quantize_static.prepare(src, percentile, [batch], scratch / "p", False)
