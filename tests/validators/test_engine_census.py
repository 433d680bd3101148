"""What ONNX Runtime's CPU provider runs of a QDQ graph, on a tiny real graph at each optimization
level: the Q/DQ group fused into an INT8 kernel, or left around a float MatMul. (On NNCF's transformer
INT8 of MiniLM the same census finds 6 of its 48 quantized MatMuls left in float at level `all`.)"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from temper.artifacts.engines.onnxruntime import SessionSettings
from temper.validators.census import of_file
from temper.validators.engine_census import of_session

SETTINGS = SessionSettings(intra_op_threads=1)


def _qdq_matmul(path: Path, requantized: bool) -> Path:
    """a [2, 4] x b [4, 3], each through QuantizeLinear -> DequantizeLinear; with `requantized` the
    product goes through a Q/DQ pair too (the form ONNX Runtime fuses into QLinearMatMul)."""
    inits = [numpy_helper.from_array(np.array(0.05, np.float32), "scale"),
             numpy_helper.from_array(np.array(128, np.uint8), "zero")]
    nodes = []
    for name in ("a", "b"):
        nodes += [helper.make_node("QuantizeLinear", [name, "scale", "zero"], [f"{name}_q"]),
                  helper.make_node("DequantizeLinear", [f"{name}_q", "scale", "zero"], [f"{name}_dq"])]
    product = "p" if requantized else "y"
    nodes.append(helper.make_node("MatMul", ["a_dq", "b_dq"], [product], name="mm"))
    if requantized:
        nodes += [helper.make_node("QuantizeLinear", ["p", "scale", "zero"], ["p_q"]),
                  helper.make_node("DequantizeLinear", ["p_q", "scale", "zero"], ["y"])]
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 4]),
                                             helper.make_tensor_value_info("b", TensorProto.FLOAT, [4, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path


@pytest.mark.parametrize("requantized, level, on_ort", [
    (True, "all", "quantized"), (False, "all", "quantized"), (True, "extended", "quantized"),
    (True, "basic", "fp32"), (True, "disable", "fp32")],
    ids=["qlinear-at-all", "integer-to-float-at-all", "qlinear-at-extended", "float-at-basic", "float-unoptimized"])
def test_the_engine_census_counts_what_onnx_runtime_runs(tmp_path, requantized, level, on_ort):
    """ONNX Runtime fuses Q/DQ groups from its `extended` level up: below it the same QDQ file, INT8 by
    its graph, computes in float on dequantized values."""
    model = _qdq_matmul(tmp_path / "m.onnx", requantized)
    graph = of_file(model)
    assert (graph.eligible, graph.quantized) == (1, 1)  # both forms are INT8 by the graph's census
    engine = of_session(model, SETTINGS.model_copy(update={"graph_optimization": level}))
    assert engine.eligible == 1 and getattr(engine, on_ort) == 1, engine
    assert engine.by_op["MatMul"].quantized == (on_ort == "quantized")
    assert engine.dynamic == (on_ort == "quantized" and not requantized)  # MatMulIntegerToFloat
