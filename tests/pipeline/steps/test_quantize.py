"""The quantize step on tiny real models, with real ONNX Runtime sessions."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, QuantFormat, quantize_static

from pipeline import onnx_io
from pipeline.errors import EnvironmentProblem, OptionError, RecipeError, StepFailed
from pipeline.recipe import InputSpec
from pipeline.step_options import QuantizeOptions
from pipeline.steps.base import Batch, StepContext
from pipeline.steps.quantize import Quantize, quantize_modelopt

STEP = Quantize()
FLOAT_OPS = {"Conv", "MatMul", "Gemm"}


def _init(name: str, array: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(array.astype(np.float32), name)


def _save(nodes: list, inits: list, x_shape: list, y_shape: list, path: Path) -> Path:
    graph = helper.make_graph(
        nodes,
        "net",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path


def conv_net(path: Path, batch: int | str = "batch") -> Path:
    """Conv -> Relu -> Conv -> Relu -> Flatten -> MatMul + Add, seeded weights."""
    rng = np.random.default_rng(0)
    inits = [
        _init("w1", rng.normal(0, 0.5, (8, 1, 3, 3))),
        _init("b1", rng.normal(0, 0.1, 8)),
        _init("w2", rng.normal(0, 0.2, (8, 8, 3, 3))),
        _init("b2", rng.normal(0, 0.1, 8)),
        _init("wf", rng.normal(0, 0.1, (8 * 4 * 4, 10))),
        _init("bf", rng.normal(0, 0.1, 10)),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", strides=[2, 2]),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("Flatten", ["r2"], ["f"], name="flatten"),
        helper.make_node("MatMul", ["f", "wf"], ["m"], name="fc"),
        helper.make_node("Add", ["m", "bf"], ["y"], name="fc_bias"),
    ]
    return _save(nodes, inits, [batch, 1, 10, 10], [batch, 10], path)


def gemm_mlp(path: Path) -> Path:
    """x[?, 100] -> Gemm fc1 -> Relu -> Gemm fc2 -> y[?, 10], as torch exports nn.Linear."""
    rng = np.random.default_rng(1)
    inits = [
        _init("w1", rng.normal(0, 0.1, (64, 100))),
        _init("b1", rng.normal(0, 0.1, 64)),
        _init("w2", rng.normal(0, 0.1, (10, 64))),
        _init("b2", rng.normal(0, 0.1, 10)),
    ]
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], name="fc1", transB=1),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("Gemm", ["r", "w2", "b2"], ["y"], name="fc2", transB=1),
    ]
    return _save(nodes, inits, ["batch", 100], ["batch", 10], path)


def images(seed: int, rows: int = 16) -> Batch:
    return {"x": np.random.default_rng(seed).normal(0, 1, (rows, 1, 10, 10)).astype(np.float32)}


def heavy_tailed(seed: int, rows: int = 16) -> Batch:
    """Student-t samples: rare large values, where MinMax, Entropy and Percentile disagree."""
    return {"x": np.random.default_rng(seed).standard_t(3, (rows, 1, 10, 10)).astype(np.float32)}


def context(tmp_path: Path, calibration: list[Batch], sample: Batch | None = None) -> StepContext:
    scratch = tmp_path / "scratch"
    scratch.mkdir(exist_ok=True)
    return StepContext(
        inputs=[InputSpec(name="x", shape=["batch", 1, 10, 10])],
        calibration=lambda: calibration,
        sample=lambda: sample if sample is not None else calibration[0],
        scratch=scratch,
    )


def quantize(src: Path, tmp_path: Path, ctx: StepContext | None = None, name: str = "q", **options) -> onnx.ModelProto:
    """Validate and run the step as the runner does; return the quantized model."""
    opts = QuantizeOptions(**options)
    STEP.validate(onnx_io.load_structure(src), opts)
    dst = tmp_path / f"{name}.onnx"
    STEP.run(src, dst, opts, ctx or context(tmp_path, [images(seed) for seed in range(4)]))
    return onnx.load(str(dst))


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def outputs_close(src: Path, model: onnx.ModelProto, tmp_path: Path, batch: Batch) -> float:
    path = tmp_path / "check.onnx"
    onnx.save(model, str(path))
    return cosine(onnx_io.run(src, batch)[0], onnx_io.run(path, batch)[0])


def ops(model: onnx.ModelProto) -> list[str]:
    return [node.op_type for node in model.graph.node]


def initializers(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}


def activation_scales(model: onnx.ModelProto) -> dict[str, float]:
    """Scale of each activation QuantizeLinear, by the float tensor it quantizes."""
    inits = initializers(model)
    return {
        node.input[0]: float(inits[node.input[1]])
        for node in model.graph.node
        if node.op_type == "QuantizeLinear" and node.input[0] not in inits
    }


def producers(model: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    return {out: node for node in model.graph.node for out in node.output}


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


def _float_node(model: onnx.ModelProto, name: str, op_type: str, weight: str) -> bool:
    """The node is still a float op reading its float weight, not a DequantizeLinear output."""
    node = next((n for n in model.graph.node if n.name == name), None)
    inits = initializers(model)
    return node is not None and node.op_type == op_type and weight in node.input and inits[weight].dtype == np.float32


def test_static_excluded_nodes_stay_float(tmp_path: Path) -> None:
    src = conv_net(tmp_path / "net.onnx")
    model = quantize(src, tmp_path, mode="static", exclude_nodes=["conv2", "fc"])

    assert _float_node(model, "conv2", "Conv", "w2")
    # quant_pre_process fused MatMul `fc` with its Add into Gemm `fc/MatMulAddFusion`: the exclusion follows it.
    assert _float_node(model, "fc/MatMulAddFusion", "Gemm", "wf")
    assert initializers(model)["w1_quantized"].dtype == np.int8, "conv1 is still quantized"


def test_static_excluded_op_type_survives_fusion(tmp_path: Path) -> None:
    src = conv_net(tmp_path / "net.onnx")
    model = quantize(src, tmp_path, mode="static", exclude_op_types=["MatMul"])

    assert _float_node(model, "fc/MatMulAddFusion", "Gemm", "wf")
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
    by_type = quantize(src, tmp_path, ctx, name="by_type", mode="dynamic", exclude_op_types=["Gemm"])

    assert ops(by_name).count("MatMulInteger") == 1
    assert "MatMulInteger" not in ops(by_type)


def test_unknown_node_name_is_an_option_error_with_the_closest_name(tmp_path: Path) -> None:
    model = onnx_io.load_structure(conv_net(tmp_path / "net.onnx"))
    with pytest.raises(OptionError) as err:
        STEP.validate(model, QuantizeOptions(mode="static", exclude_nodes=["conv1", "conv_2"]))
    assert err.value.key == "exclude_nodes[1]"
    assert "'conv_2' is not in the graph" in err.value.message and "closest: conv2" in err.value.message

    with pytest.raises(OptionError) as err:
        STEP.validate(model, QuantizeOptions(mode="static", exclude_nodes=["zzz"]))
    assert "it has: conv1, relu1" in err.value.message


def test_unknown_op_type_is_an_option_error(tmp_path: Path) -> None:
    model = onnx_io.load_structure(conv_net(tmp_path / "net.onnx"))
    with pytest.raises(OptionError) as err:
        STEP.validate(model, QuantizeOptions(mode="dynamic", exclude_op_types=["Convv"]))
    assert err.value.key == "exclude_op_types[0]" and "closest: Conv" in err.value.message


@pytest.mark.parametrize(
    ("options", "key"),
    [
        ({"mode": "static", "activation_type": "int8", "weight_type": "uint8"}, "weight_type"),
        ({"mode": "static", "calibration": "entropy", "num_bins": 128}, "num_bins"),
        ({"mode": "static", "backend": "modelopt", "calibration": "percentile"}, "calibration"),
        ({"mode": "static", "backend": "modelopt", "activation_type": "uint8"}, "activation_type"),
    ],
)
def test_options_the_backend_cannot_honour_are_refused(tmp_path: Path, options: dict, key: str) -> None:
    model = onnx_io.load_structure(conv_net(tmp_path / "net.onnx"))
    with pytest.raises(OptionError) as err:
        STEP.validate(model, QuantizeOptions(**options))
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


def test_calibration_errors_propagate(tmp_path: Path) -> None:
    def no_data() -> list[Batch]:
        raise RecipeError("recipe.yaml", "data.calibration", "no calibration data")

    src = conv_net(tmp_path / "net.onnx")
    ctx = StepContext(inputs=[], calibration=no_data, sample=lambda: images(0), scratch=tmp_path)
    with pytest.raises(RecipeError, match="no calibration data"):
        STEP.run(src, tmp_path / "q.onnx", QuantizeOptions(mode="static"), ctx)


# failures


def test_library_failure_is_one_step_failed_line(tmp_path: Path) -> None:
    src = conv_net(tmp_path / "net.onnx")
    float64 = {"x": images(0)["x"].astype(np.float64)}  # the calibration session rejects it
    with pytest.raises(StepFailed) as err:
        quantize(src, tmp_path, context(tmp_path, [float64], images(0)), mode="static")
    message = str(err.value)
    assert message.startswith("quantize: ONNX Runtime static quantization failed: ")
    assert "\n" not in message and "Traceback" not in message


def test_nan_output_fails_the_step(tmp_path: Path) -> None:
    """y = Log(x @ W): negative products give NaN, which the check after quantizing must catch."""
    w = numpy_helper.from_array(np.random.default_rng(2).normal(0, 1, (100, 10)).astype(np.float32), "w")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"], name="fc"),
        helper.make_node("Log", ["m"], ["y"], name="log"),
    ]
    src = _save(nodes, [w], ["batch", 100], ["batch", 10], tmp_path / "log.onnx")
    sample = {"x": np.random.default_rng(3).normal(0, 1, (4, 100)).astype(np.float32)}
    with pytest.raises(StepFailed, match="output 'y' of the quantized model has NaN/Inf"):
        quantize(src, tmp_path, context(tmp_path, [], sample), mode="dynamic")


# 6. ModelOpt


def _modelopt_imports() -> bool:
    try:
        quantize_modelopt.require()
    except EnvironmentProblem:
        return False
    return True


HAS_MODELOPT = _modelopt_imports()


@pytest.mark.skipif(HAS_MODELOPT, reason="NVIDIA ModelOpt is installed and imports here")
def test_modelopt_backend_without_modelopt_is_an_environment_problem(tmp_path: Path) -> None:
    src = conv_net(tmp_path / "net.onnx")
    with pytest.raises(EnvironmentProblem, match=r"pip install 'temper-ml\[modelopt\]'"):
        quantize(src, tmp_path, mode="static", backend="modelopt")


@pytest.mark.skipif(not HAS_MODELOPT, reason="NVIDIA ModelOpt is not installed (pip install 'temper-ml[modelopt]')")
def test_modelopt_backend_quantizes_on_cpu(tmp_path: Path) -> None:
    src = conv_net(tmp_path / "net.onnx")
    model = quantize(src, tmp_path, mode="static", backend="modelopt", exclude_nodes=["conv2"])

    assert {"QuantizeLinear", "DequantizeLinear"} <= set(ops(model))
    assert _float_node(model, "conv2", "Conv", "w2")
    assert outputs_close(src, model, tmp_path, images(99)) > 0.99
