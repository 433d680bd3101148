"""Dynamic INT8 with ONNX Runtime: weights quantized ahead, activations at run time."""

from __future__ import annotations

from pathlib import Path

import onnx
from onnxruntime.quantization import QuantType, quantize_dynamic
from onnxruntime.quantization.registry import IntegerOpsRegistry

from temper.pipeline.step_options import QuantizeOptions


def quantize(
    src: Path, dst: Path, options: QuantizeOptions, structure: onnx.ModelProto, keep_float: list[str], large: bool
) -> None:
    # The dynamic quantizer turns Gemm `g` into MatMul `g_MatMul` + Add before it matches
    # node names, so an excluded Gemm must be excluded under its new name too.
    gemms = {node.name for node in structure.graph.node if node.op_type == "Gemm"}
    nodes = keep_float + [f"{name}_MatMul" for name in keep_float if name in gemms]
    quantize_dynamic(
        onnx.load(str(src)),  # a ModelProto: the library then writes its temp files in its own folder
        str(dst),
        op_types_to_quantize=sorted(set(IntegerOpsRegistry) - set(options.exclude_op_types)),
        per_channel=options.per_channel,
        reduce_range=options.reduce_range,
        weight_type=QuantType.QInt8 if options.weight_type == "int8" else QuantType.QUInt8,
        nodes_to_exclude=nodes,
        use_external_data_format=large,
        extra_options={} if options.symmetric_weights is None else {"WeightSymmetric": options.symmetric_weights},
    )
