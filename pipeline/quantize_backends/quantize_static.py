"""Static INT8 with ONNX Runtime: quant_pre_process (preprocess.py), calibrate, quantize.

We drive the calibrator ourselves because `quantize_static` passes no histogram size to it:
Entropy then runs with 128 bins for 128 quantized bins, its only candidate threshold is the
full range, and the scales come out equal to MinMax. The ranges we compute go back into
`quantize_static` through its calibration cache, so the graph rewrite stays the library's own.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import onnx
import onnx.version_converter
from onnxruntime.quantization import (
    CalibrationDataReader,
    CalibrationMethod,
    QuantFormat,
    QuantType,
    create_calibrator,
    quantize_static,
    save_tensors_data,
)
from onnxruntime.quantization.calibrate import load_tensors_data
from onnxruntime.quantization.registry import QDQRegistry, QLinearOpsRegistry

from temper.artifacts.core import onnx_io
from temper.artifacts.core.errors import OptionError, StepFailed, first_line
from temper.artifacts.core.host import profile
from temper.artifacts.core.onnx_io import Batch
from temper.artifacts.formats.integrity import content_digests
from temper.pipeline.quantize_backends import entropy, failures, preprocess

if TYPE_CHECKING:
    from temper.pipeline.quantize_backends.ort import OrtOptions

METHODS = {
    "minmax": CalibrationMethod.MinMax,
    "entropy": CalibrationMethod.Entropy,
    "percentile": CalibrationMethod.Percentile,
}
QUANT_TYPES = {"int8": QuantType.QInt8, "uint8": QuantType.QUInt8}
FORMATS = {"qdq": QuantFormat.QDQ, "qoperator": QuantFormat.QOperator}
ENTROPY_QUANTIZED_BINS = 128  # create_calibrator's default num_quantized_bins


def validate(options: OrtOptions) -> None:
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


@dataclass(frozen=True)
class Prepared:
    """The float model the quantizer reads (pre-processed unless `preprocess: false`) and its calibrated
    ranges: what any number of quantized variants (the fallback's trials) share, so each trial costs one
    graph rewrite and no calibration."""

    model: Path
    ranges: Path
    large: bool

    @cached_property
    def structure(self) -> onnx.ModelProto:
        return onnx_io.load_structure(self.model)


# The calibrator makes every tensor a graph output, so one call holds all of that call's activations
# at once (MiniLM, 32 rows of 128 tokens: about 4 GiB). MinMax (and the SQNR ranking) reads a few rows per call: min and
# max do not depend on how rows are split. The histogram methods (entropy, percentile) keep one call
# per calibration batch, since their histograms do depend on it: data.calibration.batch_size bounds
# their memory. A model with a fixed batch dim takes whole batches.
CALIBRATION_ROWS_PER_CALL = 8
PER_CHANNEL_OPSET = 13  # DequantizeLinear's `axis` (per-channel scales) arrived in opset 13


class KeptRanges(Protocol):
    """Where calibrated ranges are kept between candidates and runs (pipeline.cache.RangeStore)."""

    def get(self, parts: dict[str, Any]) -> str | None: ...

    def put(self, parts: dict[str, Any], ranges: Path) -> None: ...


def prepare(src: Path, options: OrtOptions, feeds: list[Batch], scratch: Path, large: bool,
            kept: KeptRanges | None = None) -> Prepared:
    """The model the quantizer reads and its calibrated ranges. With `kept`, ranges calibrated before
    from the same model bytes, calibration options, data and host are read back instead."""
    src = _upgraded(src, scratch, large) if options.per_channel else src
    model = preprocess.pre_process(src, scratch, large) if options.preprocess else src
    ranges = scratch / "ranges.json"
    parts = _calibrated_from(model, options, feeds) if kept is not None else {}
    if kept is not None and (found := kept.get(parts)) is not None:
        ranges.write_text(found)
        return Prepared(model, ranges, large)
    _calibrate(model, options, feeds, scratch, large, ranges)
    if kept is not None:
        kept.put(parts, ranges)
    return Prepared(model, ranges, large)


def _calibrated_from(model: Path, options: OrtOptions, feeds: list[Batch]) -> dict[str, Any]:
    """What a calibration depends on: the model's bytes, the calibration options (weight settings such
    as per_channel never enter it), the data and how it is split into calls, and the host's kernels."""
    return {"model": content_digests(model, onnx_io.load_structure(model)), "method": options.calibration,
            "num_bins": options.num_bins, "percentile": options.percentile,
            "symmetric": options.symmetric_activations, "op_types": op_types(options),
            "rows_per_call": CALIBRATION_ROWS_PER_CALL, "data": onnx_io.fingerprint(feeds),
            "host": profile().kernels()}


def _calibrate(model: Path, options: OrtOptions, feeds: list[Batch], scratch: Path, large: bool,
               ranges: Path) -> None:
    with failures.stage("calibration", failures.keep_float(options.preprocess)):
        calibrator = create_calibrator(
            model,
            op_types(options),
            augmented_model_path=str(scratch / "augmented.onnx"),
            calibrate_method=METHODS[options.calibration],
            use_external_data_format=large,
            extra_options={"num_bins": options.num_bins, "percentile": options.percentile,
                           "symmetric": options.symmetric_activations},
        )
        for part in in_calls(model, feeds, split=options.calibration == "minmax"):
            calibrator.collect_data(_Reader([part]))  # every activation of a call is held at once
        # entropy: the library's threshold search, vectorized (the same thresholds, seconds faster)
        computed = (entropy.thresholds(calibrator.collector) if options.calibration == "entropy"
                    else calibrator.compute_data())
        save_tensors_data(computed, ranges)


def unbinnable(prepared: Prepared, method: str) -> str | None:
    """Why a histogram method (entropy, percentile) cannot calibrate where `prepared` was calibrated with
    MinMax: a tensor whose range is not finite (an attention mask's -inf). The histogram calibrator finds
    that only after holding a whole calibration batch of every activation (MiniLM: about 2.6 GiB), so
    the fallback asks here first and skips that configuration without calibrating. None: no such tensor."""
    for name, tensor in load_tensors_data(prepared.ranges).data.items():
        low, high = (np.asarray(value, dtype=np.float64) for value in tensor.range_value)
        if not (np.isfinite(low).all() and np.isfinite(high).all()):
            return (f"quantize: calibration failed: tensor '{name}' spans [{low.min()}, {high.max()}] in the "
                    f"MinMax calibration, which is not finite: {method}'s histograms cannot bin it")
    return None


def _upgraded(src: Path, scratch: Path, large: bool) -> Path:
    """`src` at opset 13 when it is older, with onnx's version converter: per-channel Q/DQ cannot be
    written below it, and models exported years ago (OCR, detection) often are opset 11 or 12."""
    structure = onnx_io.load_structure(src)
    opset = next((o.version for o in structure.opset_import if o.domain in ("", "ai.onnx")), PER_CHANNEL_OPSET)
    if opset >= PER_CHANNEL_OPSET:
        return src
    try:
        model = onnx.version_converter.convert_version(onnx.load(str(src)), PER_CHANNEL_OPSET)
    except Exception as exc:  # an op the converter cannot carry forward
        raise StepFailed(f"quantize: per_channel needs opset {PER_CHANNEL_OPSET} and this model is opset {opset}; "
                         f"onnx's version converter could not upgrade it ({first_line(exc)}): set per_channel: false "
                         "or re-export at a newer opset") from exc
    upgraded = scratch / "upgraded.onnx"
    onnx.save_model(model, str(upgraded), save_as_external_data=large)
    return upgraded


def write(prepared: Prepared, dst: Path, options: OrtOptions, keep_float: list[str]) -> None:
    """The quantized model with `keep_float` (node names of the pre-processed graph) left in float."""
    with failures.stage("quantize_static", failures.keep_float(options.preprocess)):
        quantize_static(
            str(prepared.model),
            str(dst),
            None,
            quant_format=FORMATS[options.format],
            op_types_to_quantize=op_types(options),
            per_channel=options.per_channel,
            reduce_range=options.reduce_range,
            activation_type=QUANT_TYPES[options.activation_type],
            weight_type=QUANT_TYPES[options.weight_type],
            nodes_to_exclude=keep_float,
            use_external_data_format=prepared.large,
            calibrate_method=METHODS[options.calibration],
            calibration_cache_path=prepared.ranges,
            extra_options=extra_options(options),
        )


def op_types(options: OrtOptions) -> list[str]:
    return sorted((set(QLinearOpsRegistry) | set(QDQRegistry)) - set(options.exclude_op_types))


def extra_options(options: OrtOptions) -> dict[str, Any]:
    """ONNX Runtime's names for the symmetry and Q/DQ-pair settings (unset ones keep its defaults)."""
    extra: dict[str, Any] = {"ActivationSymmetric": options.symmetric_activations}
    if options.symmetric_weights is not None:
        extra["WeightSymmetric"] = options.symmetric_weights
    if options.dedicated_qdq_pairs:
        extra |= {"AddQDQPairToWeight": True, "DedicatedQDQPair": True}
    return extra


def in_calls(model: Path, feeds: list[Batch], split: bool) -> Iterator[Batch]:
    """`feeds` as the runs that read `model`'s activations: CALIBRATION_ROWS_PER_CALL rows each when
    the result does not depend on how rows are split (`split`: MinMax, the SQNR ranking's energy
    sums) and the model's batch dim is dynamic; otherwise whole batches."""
    batch_dims = [shape[0] if shape else None for shape in onnx_io.dims(onnx_io.load_structure(model)).values()]
    rows = CALIBRATION_ROWS_PER_CALL if split and not any(isinstance(dim, int) for dim in batch_dims) else None
    for feed in feeds:
        yield from _in_parts(feed, rows)


def _in_parts(feed: Batch, rows: int | None) -> list[Batch]:
    """`feed` cut into batches of at most `rows` rows along axis 0, when every input has that axis in
    common; otherwise (a fixed batch dim, a rank-0 input, inputs of different lengths) whole."""
    lengths = {value.shape[0] if value.ndim else -1 for value in feed.values()}
    if rows is None or len(lengths) != 1 or -1 in lengths:
        return [feed]
    total = int(next(iter(lengths)))
    return [{name: value[start:start + rows] for name, value in feed.items()} for start in range(0, total, rows)]


class _Reader(CalibrationDataReader):
    def __init__(self, feeds: list[Batch]) -> None:
        self._feeds = iter(feeds)

    def get_next(self) -> Batch | None:
        return next(self._feeds, None)
