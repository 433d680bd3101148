"""ONNX Runtime's quantizer: dynamic INT8 (quantize_dynamic.py) and static INT8 (quantize_static.py), both after
quant_pre_process (preprocess.py) unless `preprocess: false`; the target presets (pipeline/presets.py) fill
what a step leaves unset. The accuracy-aware `fallback` tunes this backend's static INT8 (the quantize step
drives it: pipeline/steps/quantize/fallback.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field, PositiveInt, model_validator

from temper.pipeline import presets
from temper.pipeline.quantize_backends.base import Job, QuantizeCommon
from temper.pipeline.step_options import FallbackOptions

if TYPE_CHECKING:
    from temper.pipeline.quantize_backends.quantize_static import Prepared


class OrtOptions(QuantizeCommon):
    """INT8 with ONNX Runtime's quantizer. `mode: dynamic` needs no data; `mode: static` calibrates on the
    recipe's data."""

    backend: Literal["ort"] = "ort"
    preset: Literal[(presets.AUTO, *presets.PRESETS)] | None = Field(  # type: ignore[valid-type]
        None, description="a target preset (see pipeline/presets.py) that fills the options this step leaves "
        "unset; in a recipe a step without one is auto: the preset for the recipe's target; null keeps "
        "ONNX Runtime's defaults")
    preprocess: bool = Field(
        True, description="run ONNX Runtime's quant_pre_process first (symbolic shape inference, constant folding, "
                          "fusions); false quantizes the graph as it is, for a model pre-processing fails on: no "
                          "fused ops and no inferred shapes, so tensors of unknown shape stay float and the INT8 "
                          "model is often slower")
    format: Literal["qdq", "qoperator"] = "qdq"
    per_channel: bool = False
    reduce_range: bool = False
    calibration: Literal["minmax", "entropy", "percentile"] = "minmax"
    percentile: float = Field(99.999, gt=0, le=100, description="for calibration: percentile")
    num_bins: PositiveInt = Field(2048, description="histogram bins for entropy/percentile calibration")
    activation_type: Literal["int8", "uint8"] = "int8"
    weight_type: Literal["int8", "uint8"] = "int8"
    symmetric_activations: bool = Field(False, description="zero point 0 for activations (TensorRT needs it)")
    symmetric_weights: bool | None = Field(None, description="zero point 0 for weights (default: ONNX Runtime's, "
                                                             "symmetric for int8 weights)")
    dedicated_qdq_pairs: bool = Field(False, description="a Q/DQ pair per consumer and on every weight (for TensorRT)")
    searchable: ClassVar[tuple[str, ...]] = (
        "preset", "format", "per_channel", "reduce_range", "calibration", "activation_type", "weight_type",
        "symmetric_activations", "symmetric_weights")

    fallback: FallbackOptions | None = Field(
        None, description="static only: keep harmful nodes in float until validate.accuracy holds")

    @model_validator(mode="after")
    def _static_only(self) -> OrtOptions:
        static_only = {"format", "calibration", "percentile", "num_bins", "activation_type", "symmetric_activations",
                       "dedicated_qdq_pairs", "fallback"}
        misplaced = sorted(static_only & self.model_fields_set) if self.mode == "dynamic" else []
        if misplaced:
            raise ValueError(f"{', '.join(repr(m) for m in misplaced)}: only for mode: static")
        return self


class OnnxRuntimeQuantizer:
    name = "ort"
    label = "ONNX Runtime's quantizer"
    options = OrtOptions
    libraries = ("onnxruntime",)

    def require(self) -> None:
        """ONNX Runtime is every install's (an extra of its own, checked by `require_one_runtime`)."""

    def validate(self, options: OrtOptions) -> None:
        if options.mode == "static":
            from temper.pipeline.quantize_backends import quantize_static

            quantize_static.validate(options)

    def stage(self, options: OrtOptions) -> str:
        return f"ONNX Runtime {options.mode} quantization"

    def quantize(self, job: Job, options: OrtOptions) -> None:
        from temper.pipeline.quantize_backends import quantize_dynamic, quantize_static

        if options.mode == "dynamic":
            quantize_dynamic.quantize(job.src, job.dst, options, job.typed, job.scratch, job.large)
            return
        prepared, keep_float = prepare(job, options)
        quantize_static.write(prepared, job.dst, options, keep_float)


def prepare(job: Job, options: OrtOptions, feeds: list[Any] | None = None,
            folder: str | None = None) -> tuple[Prepared, list[str]]:
    """Static INT8's calibrated model (quantize_static.Prepared) and the nodes kept float, named as its graph has
    them; `folder`: a scratch subfolder of its own (another configuration's calibration keeps the first one's
    files)."""
    from temper.pipeline.quantize_backends import preprocess, quantize_static

    scratch = job.scratch / folder if folder else job.scratch
    scratch.mkdir(exist_ok=True)
    data = job.feeds(job.layout) if feeds is None else feeds
    prepared = quantize_static.prepare(job.src, options, data, scratch, job.large, job.ranges)
    return prepared, preprocess.follow_fusions(prepared.structure, options.exclude_nodes, job.typed)


ORT = OnnxRuntimeQuantizer()
