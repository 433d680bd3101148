"""The per-step options models: what a recipe may write under each step, one pydantic model per step.

pipeline.recipe assembles them into `StepSpec`; the loader, the search and the steps read them.
Each step's class (pipeline/steps/) names its model as `Step.options_model`. The quantize step's options
are its backends' own models (pipeline/quantize_backends/), of which `FallbackOptions` is ONNX Runtime's.
"""

from __future__ import annotations

from pydantic import Field, PositiveInt, field_validator, model_validator

from temper.artifacts.core.strict import Strict


class SimplifyOptions(Strict):
    """onnx-simplifier: constant folding and redundant-node elimination."""

    skip_fuse_bn: bool = False
    check_n: int = Field(1, ge=0, description="random-input comparisons onnxsim runs against the input model")


class FixShapesOptions(Strict):
    """Make symbolic dims concrete, by dim name (all inputs) or per input (full shape)."""

    dims: dict[str, PositiveInt] = Field(default_factory=dict)
    inputs: dict[str, list[PositiveInt]] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _something(self) -> FixShapesOptions:
        if not self.dims and not self.inputs:
            raise ValueError("give 'dims' (e.g. {batch: 1, seq: 128}) or 'inputs' (e.g. {pixels: [1, 1, 8, 8]})")
        return self


class Fp16Options(Strict):
    """FP16 conversion with ONNX Runtime's converter; one real batch must run without NaN/Inf."""

    keep_io_types: bool = True
    op_block_list: list[str] | None = Field(None, description="op types kept in FP32 (default: ONNX Runtime's list)")
    node_block_list: list[str] = Field(default_factory=list, description="node names kept in FP32")


class FallbackOptions(Strict):
    """Accuracy-aware fallback for static INT8: keep the nodes that hurt most in float until the
    validate.accuracy budget (and validate.fidelity) hold, ranked by the SQNR of their tensors on calibration data."""

    max_trials: PositiveInt = Field(
        12, description="quantize-and-evaluate rounds at most, the plain INT8 model included")
    refine: int = Field(0, ge=0, description="re-rank this many top suspects by the real metric, "
                                              "each kept in float alone (each costs a trial)")
    samples: PositiveInt = Field(64, description="calibration samples the SQNR ranking runs on")
    configurations: bool = Field(
        True, description="before any node goes float, try per-channel weights (when per_channel is false), then "
                          "percentile calibration (when minmax), keeping the best; each costs a calibration")
    min_quantized: float = Field(
        0.5, description="the floor: a trial must keep at least this fraction of the plain INT8 model's quantized "
                         "compute nodes to count; a budget met only below it is not met in INT8")

    @field_validator("min_quantized")
    @classmethod
    def _fraction(cls, value: float) -> float:
        if not 0 < value <= 1:
            raise ValueError(f"{value:g} is not a fraction above 0 and at most 1 (of the plain INT8 model's "
                             "quantized nodes a trial must keep); use e.g. 0.5, or 1 to allow no float node")
        return value
