"""The graph census on small real graphs: float, ONNX Runtime's QDQ, QOperator and dynamic output, FP16,
and compute inside an If subgraph (which the quantizers leave alone)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_dynamic, quantize_static

from temper.validators.census import census, of_file
from tests.pipeline.steps.quantize_models import conv_net, gemm_mlp, if_model, images


class _Reader(CalibrationDataReader):
    def __init__(self) -> None:
        self.feeds = iter([images(seed) for seed in range(2)])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self.feeds, None)


def test_a_float_graph_has_every_eligible_node_in_fp32(tmp_path):
    counted = of_file(conv_net(tmp_path / "net.onnx"))
    assert (counted.eligible, counted.quantized, counted.fp32, counted.in_subgraphs) == (3, 0, 3, 0)
    assert {op: vars(c) for op, c in counted.by_op.items()} == {
        "Conv": {"quantized": 0, "fp16": 0, "fp32": 2}, "MatMul": {"quantized": 0, "fp16": 0, "fp32": 1}}
    assert counted.precision() == "fp32"


def test_onnx_runtimes_qdq_output_counts_as_quantized_through_its_dequantize_nodes(tmp_path):
    src = conv_net(tmp_path / "net.onnx")
    dst = tmp_path / "qdq.onnx"
    quantize_static(str(src), str(dst), _Reader(), quant_format=QuantFormat.QDQ, nodes_to_exclude=["fc"])
    counted = of_file(dst)
    assert (counted.eligible, counted.quantized, counted.fp32) == (3, 2, 1)  # fc excluded: still float
    assert counted.by_op["Conv"].quantized == 2 and counted.by_op["MatMul"].fp32 == 1
    assert counted.precision() == "int8-static"
    assert counted.describe() == "3 eligible nodes: 2 quantized, 0 fp16, 1 fp32"


def test_qoperator_and_dynamic_ops_count_under_the_op_they_stand_for(tmp_path):
    src = conv_net(tmp_path / "net.onnx")
    qop = tmp_path / "qop.onnx"
    quantize_static(str(src), str(qop), _Reader(), quant_format=QuantFormat.QOperator)
    static = of_file(qop)
    assert "QLinearConv" in {n.op_type for n in onnx.load(str(qop)).graph.node}
    assert (static.quantized, static.by_op["Conv"].quantized, static.dynamic) == (3, 2, 0)
    assert static.precision() == "int8-static"

    dyn = tmp_path / "dyn.onnx"
    quantize_dynamic(str(gemm_mlp(tmp_path / "mlp.onnx")), str(dyn))
    dynamic = of_file(dyn)
    assert "MatMulInteger" in {n.op_type for n in onnx.load(str(dyn)).graph.node}
    assert (dynamic.eligible, dynamic.quantized, dynamic.dynamic) == (2, 2, 2)
    assert dynamic.precision() == "int8-dynamic"


def test_fp16_compute_is_fp16_and_a_float_graph_that_only_casts_is_not(tmp_path):
    weight = numpy_helper.from_array(np.ones((4, 4), np.float16), "w")
    nodes = [helper.make_node("Cast", ["x"], ["x16"], to=TensorProto.FLOAT16),
             helper.make_node("MatMul", ["x16", "w"], ["y16"], name="mm"),
             helper.make_node("Cast", ["y16"], ["y"], to=TensorProto.FLOAT)]
    graph = helper.make_graph(nodes, "fp16", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [weight])
    counted = census(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert (counted.eligible, counted.fp16, counted.fp32) == (1, 1, 0)
    assert counted.precision() == "fp16"

    casts_only = census(onnx.load(str(conv_net(tmp_path / "net.onnx"))))
    assert casts_only.fp16 == 0 and casts_only.precision() == "fp32"


def test_compute_inside_an_if_is_counted_and_said_to_be_in_a_subgraph(tmp_path):
    src = if_model(tmp_path / "if.onnx")
    counted = of_file(src)
    assert (counted.eligible, counted.fp32, counted.in_subgraphs, counted.quantized) == (4, 4, 4, 0)
    assert counted.describe() == "4 eligible nodes: 0 quantized, 0 fp16, 4 fp32 (4 inside If/Loop/Scan subgraphs)"

    dst = tmp_path / "dyn.onnx"
    quantize_dynamic(str(src), str(dst))  # ONNX Runtime's quantizer leaves the branches alone
    assert of_file(dst).precision() == "fp32"


def test_a_quantized_node_inside_a_subgraph_counts_too():
    weight = numpy_helper.from_array(np.ones((4, 4), np.int8), "wq")
    scale = numpy_helper.from_array(np.array(0.1, np.float32), "ws")
    body = helper.make_graph(
        [helper.make_node("DequantizeLinear", ["wq", "ws"], ["w"]),
         helper.make_node("DequantizeLinear", ["xq", "ws"], ["xd"]),
         helper.make_node("Transpose", ["w"], ["wt"]),  # a layout op between: still INT8 weights
         helper.make_node("MatMul", ["xd", "wt"], ["h"], name="mm")],
        "then", [], [helper.make_tensor_value_info("h", TensorProto.FLOAT, [1, 4])], [weight, scale])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, [1, 4])])
    graph = helper.make_graph(  # x is quantized in the outer graph, read inside the branch
        [helper.make_node("QuantizeLinear", ["x", "xs"], ["xq"]),
         helper.make_node("If", ["c"], ["y"], then_branch=body, else_branch=other)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4]),
         helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [numpy_helper.from_array(np.array(0.1, np.float32), "xs")])
    counted = census(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert (counted.eligible, counted.quantized, counted.quantized_in_subgraphs) == (1, 1, 1)
    assert counted.precision() == "int8-static"


def test_a_conv_fed_through_a_maxpool_after_its_dequantize_counts_as_quantized_as_onnx_runtime_runs_it(tmp_path):
    """NNCF writes Q/DQ -> MaxPool -> Conv (the pair before the pool); ONNX Runtime's QDQ propagation moves the
    DequantizeLinear past the MaxPool and runs the Conv as QLinearConv, so the census counts it quantized."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(np.array(0.02, np.float32), "s"),
             numpy_helper.from_array(np.array(0, np.int8), "z"),
             numpy_helper.from_array(rng.integers(-127, 127, (4, 1, 3, 3)).astype(np.int8), "wq"),
             numpy_helper.from_array(np.array(0.01, np.float32), "ws")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], name="q"),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"], name="dq"),
             helper.make_node("MaxPool", ["xd"], ["p"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("DequantizeLinear", ["wq", "ws"], ["w"], name="dq_w"),
             helper.make_node("Conv", ["p", "w"], ["c"], name="conv"),
             helper.make_node("QuantizeLinear", ["c", "s", "z"], ["cq"], name="q_out"),  # QLinearConv's output
             helper.make_node("DequantizeLinear", ["cq", "s", "z"], ["y"], name="dq_out")]
    graph = helper.make_graph(nodes, "pooled", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 2, 2])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.checker.check_model(model, full_check=True)
    path = tmp_path / "pooled.onnx"
    onnx.save(model, str(path))

    counted = of_file(path)
    assert (counted.eligible, counted.quantized) == (1, 1)

    import onnxruntime as ort

    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    assert "QLinearConv" in {node.op_type for node in onnx.load(str(tmp_path / "optimized.onnx")).graph.node}
