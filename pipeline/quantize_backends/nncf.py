"""Static INT8 with Intel NNCF's post-training quantization, on its ONNX path (no OpenVINO).

NNCF places Q/DQ by its own patterns: with `model_type: transformer` it leaves attention's
softmax-to-MatMul and the elementwise arithmetic around it (mask Add, scale Mul/Div) in float, and
runs SmoothQuant and bias correction. It is an optional extra, imported only when a recipe asks for
it. What a recipe says that NNCF's ONNX path cannot do is refused by `validate`, never dropped.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar, Literal

import onnx
from pydantic import Field, field_validator, model_validator

from temper.artifacts.core import onnx_io
from temper.artifacts.core.errors import EnvironmentProblem, OptionError
from temper.artifacts.core.layout import AXIS0
from temper.artifacts.core.onnx_io import Batch
from temper.pipeline import presets
from temper.pipeline.quantize_backends.base import Job, QuantizeCommon, library_missing, quiet_logger

TELEMETRY = "openvino_telemetry"
NNCF_PRESETS = ("performance", "mixed")  # NNCF's own: symmetric activations, or asymmetric ones
_BY_PRESET = ("backend: nncf sets activations by its preset (performance: symmetric, int8 or uint8 by sign; mixed: "
              "asymmetric); use preset, or backend: ort")
_NO_HISTOGRAM = "backend: nncf does no histogram calibration; remove this option"


class NncfOptions(QuantizeCommon):
    """Static INT8 with Intel NNCF's post-training quantization (its ONNX path)."""

    backend: Literal["nncf"]
    preset: Literal[(presets.AUTO, *presets.PRESETS, *NNCF_PRESETS)] | None = Field(  # type: ignore[valid-type]
        None, description="NNCF's preset, performance or mixed (unset: NNCF's choice)")
    format: Literal["qdq"] = "qdq"
    per_channel: bool = Field(True, description="NNCF's default: per-channel weights")
    reduce_range: bool = Field(False, description="7-bit weights everywhere (unset: NNCF's, the first layer only)")
    calibration: Literal["minmax", "entropy", "percentile"] = Field(
        "minmax", description="minmax: the global min and max (unset: NNCF's mean of each batch's min and max)")
    weight_type: Literal["int8", "uint8"] = "int8"
    symmetric_weights: bool | None = None
    model_type: Literal["transformer"] | None = Field(
        None, description="transformer keeps attention's MatMuls and its elementwise arithmetic out of INT8 by "
                          "pattern, and enables SmoothQuant")
    fast_bias_correction: bool | None = Field(
        None, description="false runs NNCF's slower, more exact bias correction (unset: true)")
    smooth_quant_alpha: float | Literal[False] | None = Field(
        None, description="model_type transformer: SmoothQuant's alpha for MatMuls (0 to 1); false turns "
                          "SmoothQuant off (unset: NNCF's 0.95)")

    searchable: ClassVar[tuple[str, ...]] = ("model_type", "fast_bias_correction", "smooth_quant_alpha")
    instead: ClassVar[dict[str, str]] = {
        "activation_type": _BY_PRESET, "symmetric_activations": _BY_PRESET,
        "dedicated_qdq_pairs": "backend: nncf places its own Q/DQ pairs; use backend: ort for a pair per consumer",
        "num_bins": _NO_HISTOGRAM, "percentile": _NO_HISTOGRAM,
        "preprocess": "NNCF prepares the graph itself; it is for backend: ort only",
        "fallback": "fallback tunes ONNX Runtime's quantizer: it needs backend: ort",
    }

    @field_validator("format", mode="before")
    @classmethod
    def _qdq(cls, value: Any) -> Any:
        if value != "qdq":
            raise ValueError("backend: nncf writes QDQ graphs only (format: qdq)")
        return value

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

    @model_validator(mode="after")
    def _static(self) -> NncfOptions:
        self.only_static()
        return self


def require() -> ModuleType:
    """nncf, imported with its telemetry off.

    nncf's dependency openvino-telemetry is opt-out: imported, it writes a client id under ~/intel and
    nncf reports every quantize call to Google Analytics. A build tool must not phone home, so while
    nncf imports, its `import openvino_telemetry` fails and nncf falls back to its own no-op stub (its
    documented path when the package is absent). A process that imported nncf itself keeps its choice.
    """
    saved = sys.modules.get(TELEMETRY)
    sys.modules[TELEMETRY] = None  # type: ignore[assignment]  # None makes the import raise ImportError
    try:
        import nncf
    except ImportError as err:
        raise EnvironmentProblem(library_missing("nncf", "Intel NNCF", "nncf", err)) from err
    finally:
        if saved is None:
            del sys.modules[TELEMETRY]
        else:
            sys.modules[TELEMETRY] = saved
    return nncf


def validate(options: NncfOptions) -> None:
    """Refuse every option NNCF's ONNX path would not honour, naming it and what to use instead."""
    given = options.model_fields_set
    if options.preset in presets.PRESETS:
        raise OptionError("preset", f"{options.preset} is a target preset for ONNX Runtime's quantizer; backend: "
                                    f"nncf takes NNCF's presets, {' or '.join(NNCF_PRESETS)}")
    if "calibration" in given and options.calibration != "minmax":
        raise OptionError("calibration", f"backend: nncf calibrates with minmax (global min and max) or, unset, "
                                         f"NNCF's mean of each batch's min and max; use backend: ort for "
                                         f"{options.calibration}")
    if options.weight_type != "int8" or options.symmetric_weights is False:
        key = "weight_type" if options.weight_type != "int8" else "symmetric_weights"
        raise OptionError(key, "backend: nncf quantizes weights to symmetric int8 only")
    if options.smooth_quant_alpha is not None and options.model_type != "transformer":
        raise OptionError("smooth_quant_alpha", "NNCF runs SmoothQuant only with model_type: transformer; "
                                                "set it, or remove smooth_quant_alpha")


class Nncf:
    name = "nncf"
    label = "NNCF"
    options = NncfOptions
    libraries = ("nncf",)

    def require(self) -> ModuleType:
        return require()

    def validate(self, options: NncfOptions) -> None:
        validate(options)

    def stage(self, options: NncfOptions) -> str:
        return "NNCF quantization"

    def quantize(self, job: Job, options: NncfOptions) -> None:
        quantize(job.src, job.dst, options, job.feeds(AXIS0), job.large)


NNCF = Nncf()


def quantize(src: Path, dst: Path, options: NncfOptions, feeds: list[Batch], large: bool) -> None:
    nncf = require()
    model = onnx.load(str(src), load_external_data=not large)  # external data: NNCF reads it from its folder
    scope = nncf.IgnoredScope(names=options.exclude_nodes, types=options.exclude_op_types)
    from nncf.common.logging import nncf_logger  # its INFO lines go to a stdout handler made at import

    with quiet_logger(nncf_logger):
        quantized = nncf.quantize(
            model,
            nncf.Dataset(feeds),
            subset_size=len(feeds),  # every calibration batch: NNCF counts dataset items, not samples
            preset=None if options.preset is None else nncf.QuantizationPreset(options.preset),
            model_type=None if options.model_type is None else nncf.ModelType(options.model_type),
            fast_bias_correction=options.fast_bias_correction is not False,
            ignored_scope=scope,
            advanced_parameters=_advanced(options, src.parent.resolve() if large else None),
        )
    onnx_io.save(quantized, dst)


def _advanced(options: NncfOptions, external_data: Path | None) -> Any:
    """NNCF's advanced parameters for the options a recipe set; unset ones keep NNCF's defaults."""
    from nncf.onnx.quantization.backend_parameters import BackendParameters
    from nncf.quantization.advanced_parameters import (
        AdvancedQuantizationParameters,
        AdvancedSmoothQuantParameters,
        OverflowFix,
        QuantizationParameters,
    )
    from nncf.quantization.range_estimator import RangeEstimatorParametersSet

    given = options.model_fields_set
    advanced = AdvancedQuantizationParameters()
    if "per_channel" in given:  # NNCF's default: per-channel weights
        advanced.weights_quantization_params = QuantizationParameters(per_channel=options.per_channel)
    if "reduce_range" in given:  # 7-bit weights everywhere, or nowhere (NNCF's default: the first layer only)
        advanced.overflow_fix = OverflowFix.ENABLE if options.reduce_range else OverflowFix.DISABLE
    if "calibration" in given:  # minmax, as ONNX Runtime's: the global min and max over every batch
        advanced.activations_range_estimator_params = RangeEstimatorParametersSet.MINMAX
    if options.smooth_quant_alpha is not None:
        alpha = -1 if options.smooth_quant_alpha is False else options.smooth_quant_alpha  # NNCF: negative is off
        advanced.smooth_quant_alphas = AdvancedSmoothQuantParameters(matmul=alpha)
    if external_data is not None:
        advanced.backend_params[BackendParameters.EXTERNAL_DATA_DIR] = str(external_data)
    return advanced

