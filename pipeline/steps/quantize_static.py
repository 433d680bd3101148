"""Static INT8 with ONNX Runtime: quant_pre_process, calibrate, quantize.

We drive the calibrator ourselves because `quantize_static` passes no histogram size to it:
Entropy then runs with 128 bins for 128 quantized bins, its only candidate threshold is the
full range, and the scales come out equal to MinMax. The ranges we compute go back into
`quantize_static` through its calibration cache, so the graph rewrite stays the library's own.
"""

from __future__ import annotations

from pathlib import Path

import onnx
from onnxruntime.quantization import (
    CalibrationDataReader,
    CalibrationMethod,
    QuantFormat,
    QuantType,
    create_calibrator,
    quantize_static,
    save_tensors_data,
)
from onnxruntime.quantization.registry import QDQRegistry, QLinearOpsRegistry
from onnxruntime.quantization.shape_inference import quant_pre_process

from pipeline import onnx_io
from pipeline.errors import OptionError
from pipeline.recipe import QuantizeOptions
from pipeline.steps.base import Batch

METHODS = {
    "minmax": CalibrationMethod.MinMax,
    "entropy": CalibrationMethod.Entropy,
    "percentile": CalibrationMethod.Percentile,
}
QUANT_TYPES = {"int8": QuantType.QInt8, "uint8": QuantType.QUInt8}
FORMATS = {"qdq": QuantFormat.QDQ, "qoperator": QuantFormat.QOperator}
ENTROPY_QUANTIZED_BINS = 128  # create_calibrator's default num_quantized_bins


def validate(options: QuantizeOptions) -> None:
    """Refuse combinations the library would reject late or quietly degrade."""
    if options.activation_type == "int8" and options.weight_type == "uint8":
        raise OptionError(
            "weight_type", "ONNX Runtime has no int8-activation/uint8-weight kernels; use weight_type: int8"
        )
    if options.calibration == "entropy" and options.num_bins <= ENTROPY_QUANTIZED_BINS:
        raise OptionError(
            "num_bins",
            f"entropy calibration needs more than {ENTROPY_QUANTIZED_BINS} bins to choose a threshold "
            f"(with {options.num_bins} it is MinMax); the default is 2048",
        )


def quantize(
    src: Path, dst: Path, options: QuantizeOptions, feeds: list[Batch], typed: list[str], scratch: Path, large: bool
) -> None:
    """`typed`: node names of the excluded op types, kept float alongside `exclude_nodes`."""
    pre = scratch / "preprocessed.onnx"
    quant_pre_process(str(src), str(pre), save_as_external_data=large)
    keep_float = follow_fusions(onnx_io.load_structure(pre), options.exclude_nodes, typed)
    op_types = sorted((set(QLinearOpsRegistry) | set(QDQRegistry)) - set(options.exclude_op_types))
    method = METHODS[options.calibration]
    calibrator = create_calibrator(
        pre,
        op_types,
        augmented_model_path=str(scratch / "augmented.onnx"),
        calibrate_method=method,
        use_external_data_format=large,
        extra_options={"num_bins": options.num_bins, "percentile": options.percentile},
    )
    calibrator.collect_data(_Reader(feeds))
    ranges = scratch / "ranges.json"
    save_tensors_data(calibrator.compute_data(), ranges)
    quantize_static(
        str(pre),
        str(dst),
        None,
        quant_format=FORMATS[options.format],
        op_types_to_quantize=op_types,
        per_channel=options.per_channel,
        reduce_range=options.reduce_range,
        activation_type=QUANT_TYPES[options.activation_type],
        weight_type=QUANT_TYPES[options.weight_type],
        nodes_to_exclude=keep_float,
        use_external_data_format=large,
        calibrate_method=method,
        calibration_cache_path=ranges,
    )


def follow_fusions(model: onnx.ModelProto, named: list[str], typed: list[str]) -> list[str]:
    """Map node names of the input graph onto the pre-processed one.

    quant_pre_process runs ONNX Runtime's basic fusions: the surviving node is renamed
    `<name>/<Fusion>` (MatMul `fc` + Add -> Gemm `fc/MatMulAddFusion`) and absorbed nodes
    vanish. A named node that vanished cannot stay float on its own, so we say so.
    """
    present = [node.name for node in model.graph.node]

    def follow(name: str) -> list[str]:
        return [name] if name in present else [p for p in present if p.startswith(name + "/")]

    keep: list[str] = []
    for index, name in enumerate(named):
        found = follow(name)
        if not found:
            raise OptionError(
                f"exclude_nodes[{index}]",
                f"node '{name}' is merged into a neighbour by quant_pre_process (ONNX Runtime's basic fusions), "
                "so it cannot stay float on its own; exclude the node it merges into",
            )
        keep += found
    for name in typed:
        keep += follow(name)
    return sorted(set(keep))


class _Reader(CalibrationDataReader):
    def __init__(self, feeds: list[Batch]) -> None:
        self._feeds = iter(feeds)

    def get_next(self) -> Batch | None:
        return next(self._feeds, None)
