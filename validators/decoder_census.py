"""What a decoder's weight matrices really are: 4-bit, 8-bit or float, counted on the graph (subgraphs
included), so a candidate labelled 4-bit whose quantizer skipped half the MatMuls is caught (the precision gate).

4-bit and 8-bit: MatMulNBits by its `bits` attribute; 8-bit also the INT8 dynamic forms (DynamicQuantizeMatMul,
MatMulInteger); and a MatMul or Gemm whose weight is a DequantizeLinear of a constant, by that constant's type
(INT4/UINT4 4-bit, INT8/UINT8 8-bit: what NNCF writes on opset 21 and up). Float: a MatMul or Gemm with a
constant weight (an initializer), the ones a weight quantizer is asked to replace; MatMuls of two activations
(attention inside plain graphs) are not weights and not counted.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import onnx

_EIGHT_BIT_DYNAMIC = {"DynamicQuantizeMatMul", "MatMulInteger", "QLinearMatMul"}
_STORED = {onnx.TensorProto.INT4: "4-bit", onnx.TensorProto.UINT4: "4-bit", onnx.TensorProto.INT8: "8-bit",
           onnx.TensorProto.UINT8: "8-bit"}


def _graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _graphs(attr.g)
            for sub in attr.graphs:
                yield from _graphs(sub)


def weight_census(path: Path) -> dict[str, int]:
    """{"4-bit": n, "8-bit": n, "float": n, ...}: weight matrices by what they are stored and computed in."""
    model = onnx.load(str(path), load_external_data=False)
    counts: Counter[str] = Counter()
    for graph in _graphs(model.graph):
        constants = {init.name for init in graph.initializer}
        constants |= {n.output[0] for n in graph.node if n.op_type == "Constant"}
        types = {init.name: init.data_type for init in graph.initializer}
        dequantized = {n.output[0]: _STORED.get(types.get(n.input[0], 0), onnx.TensorProto.DataType.Name(
            types.get(n.input[0], 0)).lower()) for n in graph.node
            if n.op_type == "DequantizeLinear" and n.input[0] in constants}
        for node in graph.node:
            if node.op_type == "MatMulNBits":
                bits = next((a.i for a in node.attribute if a.name == "bits"), 4)
                counts[f"{bits}-bit"] += 1
            elif node.op_type in _EIGHT_BIT_DYNAMIC:
                counts["8-bit"] += 1
            elif node.op_type in ("MatMul", "Gemm") and len(node.input) > 1 and node.input[1] in dequantized:
                counts[dequantized[node.input[1]]] += 1
            elif node.op_type in ("MatMul", "Gemm") and len(node.input) > 1 and node.input[1] in constants:
                counts["float"] += 1
    return {key: counts.get(key, 0) for key in ("4-bit", "8-bit", "float")} | {
        k: v for k, v in counts.items() if k not in ("4-bit", "8-bit", "float")}


def weight_share(census: dict[str, int], label: str) -> float:
    """The share of weight matrices in `label` ("4-bit", "8-bit", "float")."""
    total = sum(census.values())
    return census.get(label, 0) / total if total else 0.0
