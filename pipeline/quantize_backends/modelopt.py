"""Static INT8 with NVIDIA ModelOpt's ONNX PTQ: QDQ placed by TensorRT's rules, calibrated on CPU.

ModelOpt is an optional extra, imported only when a recipe asks for it.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar, Literal

import numpy as np
import onnx
from pydantic import Field, field_validator, model_validator

from temper.artifacts.core import onnx_io
from temper.artifacts.core.errors import EnvironmentProblem, OptionError, StepFailed
from temper.artifacts.core.layout import AXIS0, Layout
from temper.artifacts.core.onnx_io import Batch
from temper.pipeline import presets
from temper.pipeline.quantize_backends.base import Job, QuantizeCommon, library_missing

METHODS = {"minmax": "max", "entropy": "entropy"}


class ModelOptOptions(QuantizeCommon):
    """Static INT8 with NVIDIA ModelOpt: signed int8, weights per channel, Q/DQ placed by TensorRT's rules."""

    backend: Literal["modelopt"]
    preset: Literal[(presets.AUTO, *presets.PRESETS)] | None = Field(  # type: ignore[valid-type]
        None, description="none: ModelOpt places and types its Q/DQ itself (auto is dropped)")
    format: Literal["qdq"] = "qdq"
    per_channel: bool = True
    reduce_range: bool = False
    calibration: Literal["minmax", "entropy", "percentile"] = "minmax"
    activation_type: Literal["int8", "uint8"] = "int8"
    weight_type: Literal["int8", "uint8"] = "int8"

    instead: ClassVar[dict[str, str]] = {
        "preprocess": "ModelOpt prepares the graph itself; it is for backend: ort only",
        "num_bins": "backend: modelopt chooses its own histogram; remove this option",
        "percentile": "backend: modelopt chooses its own histogram; remove this option",
        "fallback": "fallback tunes ONNX Runtime's quantizer: it needs backend: ort",
    }

    @field_validator("format", mode="before")
    @classmethod
    def _qdq(cls, value: Any) -> Any:
        if value != "qdq":
            raise ValueError("backend: modelopt writes QDQ graphs only (format: qdq)")
        return value

    @model_validator(mode="after")
    def _static(self) -> ModelOptOptions:
        self.only_static()
        return self


def require() -> ModuleType:
    try:
        import modelopt.onnx.quantization as moq
    except ImportError as err:
        raise EnvironmentProblem(library_missing("modelopt", "NVIDIA ModelOpt", "modelopt", err)) from err
    return moq


def validate(options: ModelOptOptions) -> None:
    """ModelOpt's INT8 recipe is fixed (signed int8, weights per channel): refuse options it would ignore.
    A named preset first: it fills ONNX Runtime's settings (uint8 activations...), which would otherwise
    be blamed on keys the user never wrote."""
    if options.preset is not None:
        raise OptionError("preset", f"preset {options.preset} sets ONNX Runtime's quantizer options; backend: "
                                    "modelopt places and types its Q/DQ by TensorRT's rules itself: remove preset, "
                                    "or use backend: ort")
    if options.calibration not in METHODS:
        methods = " or ".join(METHODS)
        raise OptionError(
            "calibration", f"backend: modelopt calibrates with {methods}; use backend: ort for {options.calibration}"
        )
    for key in ("activation_type", "weight_type"):
        if getattr(options, key) != "int8":
            raise OptionError(key, "backend: modelopt quantizes to int8 only")
    if options.reduce_range:
        raise OptionError("reduce_range", "backend: modelopt has no reduced-range mode")
    if "per_channel" in options.model_fields_set and not options.per_channel:
        raise OptionError("per_channel", "backend: modelopt always quantizes weights per channel")


class ModelOpt:
    name = "modelopt"
    label = "ModelOpt"
    options = ModelOptOptions
    libraries = ("nvidia-modelopt",)

    def require(self) -> ModuleType:
        return require()

    def validate(self, options: ModelOptOptions) -> None:
        validate(options)

    def stage(self, options: ModelOptOptions) -> str:
        return "ModelOpt quantization"

    def quantize(self, job: Job, options: ModelOptOptions) -> None:
        quantize(job.src, job.dst, options, job.feeds(job.layout), job.scratch, job.large, job.layout)


MODELOPT = ModelOpt()


def layout_problem(layout: Layout) -> str | None:
    """Why ModelOpt cannot calibrate inputs laid out as `layout`, or None: it concatenates and steps through
    calibration data on axis 0, so a batch axis off 0 or a constant input is out of its reach."""
    moved = [name for name, axis in layout.inputs.items() if axis != 0]
    if not moved:
        return None
    return (f"backend modelopt calibrates inputs batched on axis 0 only, and '{moved[0]}' "
            f"{'is a constant' if layout.inputs[moved[0]] is None else 'is not'}: use backend: ort")


def quantize(src: Path, dst: Path, options: ModelOptOptions, feeds: list[Batch], scratch: Path, large: bool,
             layout: Layout = AXIS0) -> None:
    problem = layout_problem(layout)
    if problem:
        raise StepFailed(f"quantize: {problem}")
    moq = require()
    local = scratch / "modelopt_input.onnx"  # ModelOpt writes its intermediate files beside its input
    onnx_io.save(onnx.load(str(src)), local)
    stacked = {name: np.concatenate([feed[name] for feed in feeds]) for name in feeds[0]}
    # One calibration step per feed; without shapes ModelOpt would step one sample at a time on dynamic dims.
    shapes = ",".join(f"{name}:{'x'.join(map(str, array.shape))}" for name, array in feeds[0].items())
    with _ort_left_as_found():
        _modelopt_quantize(moq, local, dst, options, stacked, shapes, large)


def _modelopt_quantize(moq: ModuleType, src: Path, dst: Path, options: ModelOptOptions,
                       stacked: dict[str, np.ndarray], shapes: str, large: bool) -> None:
    moq.quantize(
        str(src),
        quantize_mode="int8",
        calibration_data=stacked,
        calibration_method=METHODS[options.calibration],
        calibration_shapes=shapes,
        calibration_eps=["cpu"],
        op_types_to_exclude=options.exclude_op_types or None,
        nodes_to_exclude=[re.escape(name) + "$" for name in options.exclude_nodes] or None,  # ModelOpt takes regexes
        use_external_data_format=large,
        output_path=str(dst),
        high_precision_dtype="fp32",  # FP16 is the fp16 step's job, not a side effect of this one
        log_level="WARNING",
    )


@contextlib.contextmanager
def _ort_left_as_found() -> Iterator[None]:
    """Undo ModelOpt's patches to ONNX Runtime's quantization classes when it is done.

    ModelOpt replaces methods of ORT's calibrators and quantizers process-wide
    (`modelopt.onnx.quantization.ort_patching.patch_ort_modules`) and never restores them, so an
    ORT static candidate built after a ModelOpt one in the same run would calibrate with
    ModelOpt's code and fail ("Histogram has not been collected"). It also edits ORT's op
    registries in place (QLinearOpsRegistry, QDQRegistry: Concat, Sigmoid, Relu, ... removed), so
    that candidate would quantize other ops than it does alone: their contents are put back too.
    """
    from onnxruntime.quantization import base_quantizer, calibrate, onnx_quantizer, qdq_quantizer, quantize, registry

    modules = (calibrate, base_quantizer, onnx_quantizer, qdq_quantizer, quantize)
    classes = {value for module in modules for value in vars(module).values()
               if isinstance(value, type) and value.__module__.startswith("onnxruntime.quantization")}
    saved = [(owner, dict(vars(owner))) for owner in (*modules, *classes)]
    tables = {name: dict(table) for name, table in vars(registry).items() if isinstance(table, dict)}
    try:
        yield
    finally:
        for owner, attributes in saved:
            for name, value in attributes.items():
                if vars(owner).get(name) is not value:
                    setattr(owner, name, value)
        for name, contents in tables.items():  # in place: the quantizers hold these very dicts
            table = getattr(registry, name)
            table.clear()
            table.update(contents)
