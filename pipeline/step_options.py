"""The per-step options models: what a recipe may write under each step, one pydantic model per step.

pipeline.recipe assembles them into `StepSpec`; the loader, the search and the steps read them.
Each step's class (pipeline/steps/) names its model as `Step.options_model`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, PositiveInt, ValidationInfo, field_validator, model_validator

from temper.artifacts.strict import Strict
from temper.pipeline import presets


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


NNCF_PRESETS = ("performance", "mixed")  # NNCF's own: symmetric activations, or asymmetric ones
NNCF_ONLY = ("model_type", "fast_bias_correction", "smooth_quant_alpha")


Backend = Literal["ort", "modelopt", "nncf"]
# each quantize backend's distribution: its version is part of every step's cache key (pipeline/cache.py)
BACKEND_PACKAGES: dict[str, str] = {"ort": "onnxruntime", "modelopt": "nvidia-modelopt", "nncf": "nncf"}


class QuantizeOptions(Strict):
    """INT8 quantization. `mode: dynamic` needs no data; `mode: static` calibrates on the recipe's data."""

    mode: Literal["dynamic", "static"]
    preset: Literal[(presets.AUTO, *presets.PRESETS, *NNCF_PRESETS)] | None = Field(  # type: ignore[valid-type]
        None, description="backend ort: a target preset (see pipeline/presets.py) that fills the options this step "
        "leaves unset; in a recipe a step without one is auto: the preset for the recipe's target; null keeps "
        "ONNX Runtime's defaults. Backend nncf: NNCF's preset, performance or mixed (unset: NNCF's choice)")
    backend: Backend = "ort"
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
    exclude_nodes: list[str] = Field(default_factory=list, description="node names kept in float")
    exclude_op_types: list[str] = Field(default_factory=list, description="op types kept in float")
    fallback: FallbackOptions | None = Field(
        None, description="keep harmful nodes in float until validate.accuracy holds")
    model_type: Literal["transformer"] | None = Field(
        None, description="backend nncf: transformer keeps attention's MatMuls and its elementwise arithmetic "
                          "out of INT8 by pattern, and enables SmoothQuant")
    fast_bias_correction: bool | None = Field(
        None, description="backend nncf: false runs NNCF's slower, more exact bias correction (unset: true)")
    smooth_quant_alpha: float | Literal[False] | None = Field(
        None, description="backend nncf, model_type transformer: SmoothQuant's alpha for MatMuls "
                                      "(0 to 1); false turns SmoothQuant off (unset: NNCF's 0.95)")

    @field_validator("smooth_quant_alpha", mode="before")
    @classmethod
    def _alpha(cls, value: Any) -> Any:
        """One message for every wrong alpha (NNCF's own "off", -1, included) instead of a union's two; a whole
        number becomes a float, since 0 would otherwise match `False` (0 == False) and mean "off"."""
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if number and 0 <= value <= 1:
            return float(value)
        if value is None or value is False:
            return value
        raise ValueError(f"{value!r} is not a SmoothQuant alpha: give a number from 0 to 1, "
                         "or false to turn SmoothQuant off")

    @model_validator(mode="before")
    @classmethod
    def _preset(cls, value: Any, info: ValidationInfo) -> Any:
        """Resolve the preset before validation; the loader passes the recipe's target as context."""
        choice = (info.context or {}).get("preset_choice")
        return presets.fill(value, choice) if isinstance(value, dict) else value

    @model_validator(mode="after")
    def _consistent(self) -> QuantizeOptions:
        static_only = {"format", "calibration", "percentile", "num_bins", "activation_type", "symmetric_activations",
                       "dedicated_qdq_pairs", "fallback"}
        if self.mode == "dynamic":
            misplaced = sorted(static_only & self.model_fields_set)
            if misplaced:
                raise ValueError(f"{', '.join(repr(m) for m in misplaced)}: only for mode: static")
            if self.backend != "ort":
                raise ValueError("mode: dynamic is implemented by backend: ort only")
        if self.backend != "ort" and self.format != "qdq":
            raise ValueError(f"backend: {self.backend} writes QDQ graphs only (format: qdq)")
        if self.backend != "ort" and "preprocess" in self.model_fields_set:
            library = {"modelopt": "ModelOpt", "nncf": "NNCF"}[self.backend]
            raise ValueError(f"'preprocess': {library} prepares the graph itself; it is for backend: ort only")
        if self.backend != "ort" and self.fallback is not None:
            raise ValueError("fallback tunes ONNX Runtime's quantizer: it needs backend: ort")
        return self
