"""What a graph really computes in: a census of its compute nodes, quantized, FP16 or float.

A step's name says what it meant to do; the graph says what it did. A quantizer that met nothing it
could rewrite (the compute inside `If` bodies, every node excluded by a fallback) writes an FP32 graph
without complaint, so a candidate's precision label, the quantize step's own check and the fallback's
floor all read the graph through this module. Pure ONNX: no session, no weights (a structure loaded
without external data is enough).

Eligible nodes are the compute op types INT8 quantizers target (ELIGIBLE); a node counts as

- quantized: a QOperator or integer op (QLinearConv, MatMulInteger, ...; QUANTIZED maps each to the
  op it stands for), or an eligible float op whose activation and weight (its first two inputs) both
  come from DequantizeLinear nodes (QDQ form), possibly through layout ops (Transpose, Reshape, ...) and
  the MaxPool/Slice ONNX Runtime's QDQ propagation runs in INT8;
- fp16: an eligible float op computing in float16 (its first input or output is float16);
- fp32: the rest (float compute left as it was).

Nodes inside subgraphs (If branches, Loop and Scan bodies) are counted too, and how many of the
eligible ones sit there.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import onnx
from onnx import TensorProto

# The compute ops quantizers rewrite to INT8 (ONNX Runtime's QLinear/Integer registries, ModelOpt's defaults).
ELIGIBLE = ("Conv", "ConvTranspose", "MatMul", "Gemm", "Attention", "LSTM")

# quantized op -> the eligible op it stands for; DYNAMIC: those that quantize activations at run time
QUANTIZED = {
    "QLinearConv": "Conv", "ConvInteger": "Conv", "QLinearConvTranspose": "ConvTranspose",
    "QLinearMatMul": "MatMul", "MatMulInteger": "MatMul", "MatMulIntegerToFloat": "MatMul",
    "DynamicQuantizeMatMul": "MatMul", "QGemm": "Gemm", "QAttention": "Attention", "DynamicQuantizeLSTM": "LSTM",
}
DYNAMIC = frozenset({"ConvInteger", "MatMulInteger", "MatMulIntegerToFloat", "DynamicQuantizeMatMul", "QAttention",
                     "DynamicQuantizeLSTM"})
# Ops a DequantizeLinear's values pass through still on its INT8 grid, so the compute op after them is fed INT8:
# those that only move data, and MaxPool and Slice, which ONNX Runtime's QDQ propagation runs on the INT8 values
# (NNCF puts the Q/DQ pair before a MaxPool, not between it and the Conv).
_PASS_THROUGH = frozenset({"Transpose", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Expand",
                           "MaxPool", "Slice"})
# The inputs that must all come through a DequantizeLinear: activation and weight (two activations for
# attention's MatMuls). A bias alone does not make a node INT8, and neither does an activation alone: in
# QDQ form a float node kept out (exclude_nodes, the fallback) still reads a neighbour's dequantized output.
_DATA_INPUTS = 2


@dataclass
class OpCount:
    quantized: int = 0
    fp16: int = 0
    fp32: int = 0


@dataclass
class Census:
    """Eligible compute nodes of a graph (subgraphs included) by how they compute."""

    eligible: int = 0
    quantized: int = 0
    fp16: int = 0
    fp32: int = 0
    in_subgraphs: int = 0  # of the eligible nodes, those inside If/Loop/Scan bodies
    quantized_in_subgraphs: int = 0
    dynamic: int = 0  # of the quantized nodes, those quantizing activations at run time
    fp16_tensors: bool = False  # any node writes float16 (what tells a graph with no eligible node)
    by_op: dict[str, OpCount] = field(default_factory=dict)

    def as_dict(self) -> dict[str, object]:
        return {"eligible": self.eligible, "quantized": self.quantized, "fp16": self.fp16, "fp32": self.fp32,
                "in_subgraphs": self.in_subgraphs, "quantized_in_subgraphs": self.quantized_in_subgraphs,
                "dynamic": self.dynamic,
                "by_op": {op: vars(count).copy() for op, count in sorted(self.by_op.items())}}

    def precision(self) -> str:
        """The label the graph earns: int8-static / int8-dynamic with a quantized node, else fp16 with
        FP16 compute, else fp32 (the narrowest format present wins, as pipeline.steps.precision_of)."""
        if self.quantized:
            return "int8-dynamic" if 2 * self.dynamic > self.quantized else "int8-static"
        if self.fp16 or (not self.eligible and self.fp16_tensors):
            return "fp16"
        return "fp32"

    def describe(self) -> str:
        """One phrase: `12 eligible nodes: 3 quantized, 0 fp16, 9 fp32 (12 inside If/Loop/Scan subgraphs)`."""
        where = f" ({self.in_subgraphs} inside If/Loop/Scan subgraphs)" if self.in_subgraphs else ""
        return f"{self.eligible} eligible nodes: {self.quantized} quantized, {self.fp16} fp16, {self.fp32} fp32{where}"


# ONNX Runtime's fused float ops (com.microsoft), in the graphs it optimizes a model into: float compute
FUSED_FLOAT = {"FusedConv": "Conv", "NhwcFusedConv": "Conv", "FusedGemm": "Gemm", "FusedMatMul": "MatMul"}


def census(model: onnx.ModelProto, qdq: bool = True) -> Census:
    """Count the eligible compute nodes of `model` and its subgraphs. `qdq` False: a float op reading
    DequantizeLinear outputs computes in float (a graph an engine optimized: it fused every Q/DQ
    group it has an INT8 kernel for, so what is left computes on dequantized values)."""
    types = _elem_types(model)
    result = Census()
    graphs = list(_graphs(model.graph, 0))
    # one map for every scope: a subgraph's node may read a tensor its outer graph computes
    producers = {out: node for graph, _ in graphs for node in graph.node for out in node.output}
    for graph, depth in graphs:
        for node in graph.node:
            if any(types.get(out) == TensorProto.FLOAT16 for out in node.output):
                result.fp16_tensors = True
            kind = _kind(node, producers, types, qdq)
            if kind is None:
                continue
            op = QUANTIZED.get(node.op_type) or FUSED_FLOAT.get(node.op_type, node.op_type)
            count = result.by_op.setdefault(op, OpCount())
            setattr(count, kind, getattr(count, kind) + 1)
            setattr(result, kind, getattr(result, kind) + 1)
            result.eligible += 1
            if depth:
                result.in_subgraphs += 1
                result.quantized_in_subgraphs += kind == "quantized"
            result.dynamic += node.op_type in DYNAMIC
    return result


def of_file(path: Path) -> Census:
    """The census of a model file, read without its external weight data."""
    return census(onnx.load(str(path), load_external_data=False))


def _kind(node: onnx.NodeProto, producers: dict[str, onnx.NodeProto], types: dict[str, int],
          qdq: bool) -> str | None:
    if node.op_type in QUANTIZED:
        return "quantized"
    if node.op_type not in ELIGIBLE and node.op_type not in FUSED_FLOAT:
        return None
    data = [name for name in node.input[:_DATA_INPUTS] if name]
    if qdq and data and all(_dequantized(name, producers) for name in data):
        return "quantized"
    first = [types.get(name) for name in (*node.input[:1], *node.output[:1])]
    return "fp16" if TensorProto.FLOAT16 in first else "fp32"


def _dequantized(name: str, producers: dict[str, onnx.NodeProto]) -> bool:
    """Whether tensor `name` comes out of a DequantizeLinear, directly or through pass-through ops."""
    for _ in range(8):  # a few pass-through ops at most; a cycle-free graph ends sooner
        node = producers.get(name)
        if node is None:
            return False
        if node.op_type == "DequantizeLinear":
            return True
        if node.op_type not in _PASS_THROUGH or not node.input:
            return False
        name = node.input[0]
    return False


def _graphs(graph: onnx.GraphProto, depth: int) -> Iterator[tuple[onnx.GraphProto, int]]:
    """The graph and every subgraph in its nodes' attributes, with how deep each is nested."""
    yield graph, depth
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                yield from _graphs(attribute.g, depth + 1)
            elif attribute.type == onnx.AttributeProto.GRAPHS:
                for sub in attribute.graphs:
                    yield from _graphs(sub, depth + 1)


def _elem_types(model: onnx.ModelProto) -> dict[str, int]:
    """Tensor name -> element type, from the declarations, shape inference where it runs, and Casts."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # a custom op or a >2 GB proto: the declared types are still a census
        inferred = model
    types: dict[str, int] = {}
    for graph, _ in _graphs(inferred.graph, 0):
        for info in (*graph.input, *graph.output, *graph.value_info):
            if info.type.HasField("tensor_type"):
                types[info.name] = info.type.tensor_type.elem_type
        for init in graph.initializer:
            types[init.name] = init.data_type
        for node in graph.node:
            if node.op_type == "Cast":
                to = next((a.i for a in node.attribute if a.name == "to"), None)
                if to is not None:
                    types.setdefault(node.output[0], to)
            elif node.op_type == "Constant":
                value = next((a.t for a in node.attribute if a.name == "value"), None)
                if value is not None:
                    types.setdefault(node.output[0], value.data_type)
    return types
