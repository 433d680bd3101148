"""Dynamic INT8 with ONNX Runtime: weights quantized ahead, activations at run time.

The graph is pre-processed first, as for static INT8 (preprocess.py): the dynamic quantizer needs each
weight it rewrites as an initializer, and pre-processing folds the Constant and shape nodes that make one.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import onnx
from onnxruntime.quantization import QuantType, quantize_dynamic
from onnxruntime.quantization.registry import IntegerOpsRegistry

from temper.artifacts.core import onnx_io
from temper.pipeline.quantize_backends import failures, preprocess

if TYPE_CHECKING:
    from temper.pipeline.quantize_backends.ort import OrtOptions


def quantize(src: Path, dst: Path, options: OrtOptions, typed: list[str], scratch: Path, large: bool) -> None:
    """`typed`: the input graph's nodes of the excluded op types (kept float by name, see quantize.py)."""
    model = preprocess.pre_process(src, scratch, large) if options.preprocess else src
    structure = onnx_io.load_structure(model)
    keep_float = preprocess.follow_fusions(structure, options.exclude_nodes, typed)
    # The dynamic quantizer turns Gemm `g` into MatMul `g_MatMul` + Add before it matches
    # node names, so an excluded Gemm must be excluded under its new name too.
    gemms = {node.name for node in structure.graph.node if node.op_type == "Gemm"}
    nodes = keep_float + [f"{name}_MatMul" for name in keep_float if name in gemms]
    with failures.stage("quantize_dynamic", failures.keep_float(options.preprocess)):
        quantize_dynamic(
            onnx.load(str(model)),  # a ModelProto: the library then writes its temp files in its own folder
            str(dst),
            op_types_to_quantize=sorted(set(IntegerOpsRegistry) - set(options.exclude_op_types)),
            per_channel=options.per_channel,
            reduce_range=options.reduce_range,
            weight_type=QuantType.QInt8 if options.weight_type == "int8" else QuantType.QUInt8,
            nodes_to_exclude=nodes,
            use_external_data_format=large,
            extra_options={} if options.symmetric_weights is None else {"WeightSymmetric": options.symmetric_weights},
        )
