"""A model whose dynamic INT8 twin answers a row differently beside other rows: y = x @ W, with x's rows of two
loudnesses. ONNX Runtime's dynamic quantization computes one activation scale over the whole batch tensor, so a
quiet row quantized beside a loud one loses most of its resolution."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

WIDTH, OUT = 16, 8
LOUD = 100.0  # how much louder the loud rows are


def matmul_model(path: Path) -> Path:
    """y = x @ W: FP32, x [batch, 16] -> y [batch, 8]."""
    w = numpy_helper.from_array(np.random.default_rng(3).standard_normal((WIDTH, OUT)).astype(np.float32), "W")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], "loud",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", WIDTH])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", OUT])], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def dynamic_twin(fp32: Path, path: Path) -> Path:
    """The model quantized with ONNX Runtime's quantize_dynamic (per-tensor activation scale per run)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(fp32), str(path), weight_type=QuantType.QInt8)
    return path


def rows(count: int, loud_last: int, seed: int = 0) -> np.ndarray:
    """`count` rows of x, the last `loud_last` of them LOUD times louder."""
    x = np.random.default_rng(seed).standard_normal((count, WIDTH)).astype(np.float32)
    x[count - loud_last:] *= LOUD
    return x
