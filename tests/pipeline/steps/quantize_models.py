"""Tiny real ONNX models and helpers the quantize step's tests share: a conv net, a Gemm MLP, a model with all
its compute inside If branches, two models ONNX Runtime's quantization tools fail on, image-like and
heavy-tailed batches, and running the step as the runner does."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from temper.artifacts.core import onnx_io
from temper.artifacts.core.onnx_io import Batch
from temper.pipeline.quantize_backends import quantize_options
from temper.pipeline.recipe import InputSpec
from temper.pipeline.steps.base import StepContext
from temper.pipeline.steps.quantize import Quantize

STEP = Quantize()
FLOAT_OPS = {"Conv", "MatMul", "Gemm"}


def _init(name: str, array: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(array.astype(np.float32), name)


def save_model(nodes: list, inits: list, x_shape: list, y_shape: list, path: Path) -> Path:
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
    return save_model(nodes, inits, [batch, 1, 10, 10], [batch, 10], path)


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
    return save_model(nodes, inits, ["batch", 100], ["batch", 10], path)


def if_model(path: Path, head: bool = False) -> Path:
    """x[batch, 16] -> If(sum(x) > 0): every MatMul inside a branch, as Silero VAD keeps its compute.
    `head`: a MatMul on x before the If, the one compute node outside the branches."""
    rng = np.random.default_rng(0)
    inner = "h0" if head else "x"

    def branch(name: str) -> onnx.GraphProto:
        w1 = _init(f"{name}_w1", rng.normal(0, 0.3, (16, 16)))
        w2 = _init(f"{name}_w2", rng.normal(0, 0.3, (16, 4)))
        nodes = [helper.make_node("MatMul", [inner, w1.name], [f"{name}_h"], name=f"{name}_fc1"),
                 helper.make_node("Relu", [f"{name}_h"], [f"{name}_r"], name=f"{name}_relu"),
                 helper.make_node("MatMul", [f"{name}_r", w2.name], [f"{name}_y"], name=f"{name}_fc2")]
        return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT,
                                                                                 ["batch", 4])], [w1, w2])

    nodes = [helper.make_node("ReduceSum", ["x"], ["total"], name="total", keepdims=0),
             helper.make_node("Greater", ["total", "zero"], ["cond"], name="positive"),
             helper.make_node("If", ["cond"], ["y"], name="branch", then_branch=branch("then"),
                              else_branch=branch("else"))]
    inits = [_init("zero", np.array(0.0))]
    if head:
        nodes.insert(0, helper.make_node("MatMul", ["x", "w0"], ["h0"], name="head"))
        inits.append(_init("w0", rng.normal(0, 0.3, (16, 16))))
    return save_model(nodes, inits, ["batch", 16], ["batch", 4], path)


def constant_weight_conv(path: Path) -> Path:
    """x[batch, 1, 8, 8] -> Conv whose weight a Constant node makes: not an initializer until constants are
    folded, so ONNX Runtime's dynamic quantizer raises "Expected w to be an initializer" on it as it is."""
    weight = numpy_helper.from_array(np.random.default_rng(2).normal(0, 0.3, (4, 1, 3, 3)).astype(np.float32))
    nodes = [helper.make_node("Constant", [], ["w"], value=weight, name="weight"),
             helper.make_node("Conv", ["x", "w", "b"], ["y"], name="conv", pads=[1, 1, 1, 1])]
    return save_model(nodes, [_init("b", np.zeros(4))], ["batch", 1, 8, 8], ["batch", 4, 8, 8], path)


def runtime_axes_model(path: Path) -> Path:
    """x[batch, 16] -> MatMul -> ReduceSum over axes computed at run time, keepdims 0 -> y[batch, 1]. ONNX
    Runtime runs it; its symbolic shape inference (quant_pre_process) asserts, with no message, that it can
    only reduce over unknown axes when dims are kept."""
    rng = np.random.default_rng(3)
    ints = [numpy_helper.from_array(np.array(value, np.int64), name)
            for name, value in (("one", 1), ("first", [0]), ("second", [1]))]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="fc"),
             helper.make_node("Mul", ["x", "zero"], ["zeros"], name="zeros"),
             helper.make_node("ReduceMin", ["zeros"], ["nought"], keepdims=0, name="nought"),
             helper.make_node("Cast", ["nought"], ["index"], to=TensorProto.INT64, name="index"),
             helper.make_node("Add", ["index", "one"], ["axis"], name="axis"),  # 1, known only at run time
             helper.make_node("Unsqueeze", ["axis", "first"], ["axes"], name="axes"),
             helper.make_node("ReduceSum", ["h", "axes"], ["total"], keepdims=0, name="sum_runtime_axes"),
             helper.make_node("Unsqueeze", ["total", "second"], ["y"], name="column")]
    inits = [_init("w", rng.normal(0, 0.3, (16, 8))), _init("zero", np.array(0.0)), *ints]
    return save_model(nodes, inits, ["batch", 16], ["batch", 1], path)


def rate_model(path: Path) -> Path:
    """x[batch, 16] and a scalar int64 `sr` -> If(sr == 16000), as Silero VAD branches on its sample rate, all its
    compute inside the branches. The 16 kHz branch (MatMul, then a ReduceSum over axes computed at run time)
    is what symbolic shape inference asserts on (quant_pre_process fails on it); the other branch's Reshape
    does not fit a 16-wide row, so the model fails at run time for any rate but 16000 (random values included)."""
    rng = np.random.default_rng(4)
    ints = [numpy_helper.from_array(np.array(value, np.int64), name)
            for name, value in (("one", 1), ("first", [0]), ("second", [1]), ("rate", 16000), ("threes", [-1, 3]))]
    k16 = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w16"], ["h16"], name="k16_fc"),
         helper.make_node("Mul", ["x", "zero"], ["zeros"], name="k16_zeros"),
         helper.make_node("ReduceMin", ["zeros"], ["nought"], keepdims=0, name="k16_nought"),
         helper.make_node("Cast", ["nought"], ["index"], to=TensorProto.INT64, name="k16_index"),
         helper.make_node("Add", ["index", "one"], ["axis"], name="k16_axis"),  # 1, known only at run time
         helper.make_node("Unsqueeze", ["axis", "first"], ["axes"], name="k16_axes"),
         helper.make_node("ReduceSum", ["h16", "axes"], ["total"], keepdims=0, name="k16_sum"),
         helper.make_node("Unsqueeze", ["total", "second"], ["y16"], name="k16_column")],
        "k16", [], [helper.make_tensor_value_info("y16", TensorProto.FLOAT, ["batch", 1])])
    k8 = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w8"], ["h8"], name="k8_fc"),
         helper.make_node("Reshape", ["h8", "threes"], ["y8"], name="k8_reshape")],
        "k8", [], [helper.make_tensor_value_info("y8", TensorProto.FLOAT, ["batch", 1])])
    graph = helper.make_graph(
        [helper.make_node("Equal", ["sr", "rate"], ["is16k"], name="is16k"),
         helper.make_node("If", ["is16k"], ["y"], name="by_rate", then_branch=k16, else_branch=k8)],
        "rate", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16]),
                 helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 1])],
        [_init("w16", rng.normal(0, 0.3, (16, 8))), _init("w8", rng.normal(0, 0.3, (16, 4))),
         _init("zero", np.array(0.0)), *ints])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


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
    opts = quantize_options(options)
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


def float_node(model: onnx.ModelProto, name: str, op_type: str, weight: str) -> bool:
    """The node is still a float op reading its float weight, not a DequantizeLinear output."""
    node = next((n for n in model.graph.node if n.name == name), None)
    inits = initializers(model)
    return node is not None and node.op_type == op_type and weight in node.input and inits[weight].dtype == np.float32
