"""The recipe schema: one pydantic model per section, so YAML, JSON Schema and Python share a single
definition. Every model forbids unknown keys. Each layer owns its sections' models: the gates are
validators.spec, the data sources calibration.spec, the per-step options pipeline.step_options;
this module composes them into `Recipe`."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, BeforeValidator, Field, NonNegativeInt, PositiveInt, StringConstraints, model_validator

from temper.artifacts.core.layout import default_axes
from temper.artifacts.core.strict import CallableRef, Identifier, Strict
from temper.calibration.spec import DataSource
from temper.pipeline import presets
from temper.pipeline.quantize_backends import QuantizeOptions
from temper.pipeline.step_options import FixShapesOptions, Fp16Options, SimplifyOptions
from temper.validators.spec import ValidateSpec


def _dim(value: Any) -> int | str:
    ok_int = isinstance(value, int) and not isinstance(value, bool) and value > 0
    ok_name = isinstance(value, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", value)
    if not (ok_int or ok_name):
        raise ValueError(f"{value!r} is not a dim: use a positive integer or a symbolic name like 'batch'")
    return value


def _name(value: Any) -> str:
    if not (isinstance(value, str) and re.fullmatch(r"[a-z0-9][a-z0-9._-]*", value)):
        raise ValueError(f"{value!r} is not a valid name: use lowercase letters, digits, '.', '_' or '-'")
    return value


CandidateName = Annotated[str, BeforeValidator(_name)]
Dim = Annotated[int | str, BeforeValidator(_dim)]
DType = Literal["float32", "float16", "int64", "int32", "int8", "uint8", "bool"]


class InputSpec(Strict):
    """One model input. A string dim is symbolic (`batch`, `seq`): dynamic in the export. An input with a
    `value` is that constant in every batch (a sample rate), not data; any other holds a batch's rows on
    its `batch_axis`."""

    name: Identifier
    dtype: DType = "float32"
    shape: list[Dim] = Field(description="[] for a scalar")
    batch_axis: NonNegativeInt | None = Field(None, description="the axis holding the samples (default: the axis "
                                              "named like the first input's batch dim, else 0)")
    value: int | float | bool | list[Any] | None = Field(None, description="a constant fed in every batch, not data")

    @model_validator(mode="after")
    def _constant_or_batched(self) -> InputSpec:
        if self.value is None and not self.shape:
            raise ValueError(f"'{self.name}' has shape [] (a scalar has no axis to hold samples): "
                             "give the value it takes in every batch, e.g. value: 16000")
        if self.batch_axis is not None and (self.value is not None or self.batch_axis >= len(self.shape)):
            raise ValueError(f"batch_axis {self.batch_axis} is past the end of shape {self.shape}"
                             if self.value is None else "an input with a value is a constant: it has no batch_axis")
        given = np.asarray(self.value)
        if self.value is not None and (given.shape != tuple(self.shape) or given.dtype.kind not in "biuf"
                                       or not np.array_equal(given.astype(self.dtype), given)):
            raise ValueError(f"value {self.value!r} is not a {self.dtype} tensor of shape {self.shape} "
                             "(a constant's dims are integers)")
        return self


class ExportOptions(Strict):
    """torch.onnx.export settings; the result is compared with torch on a real batch."""

    opset: int = Field(17, ge=9, le=23)
    dynamo: bool = Field(True, description="torch.export-based exporter (torch's default); false = TorchScript")
    atol: float = Field(1e-4, ge=0)
    rtol: float = Field(1e-3, ge=0)


class ModelSpec(Strict):
    """Either a PyTorch factory returning an nn.Module, or an existing ONNX file."""

    factory: CallableRef | None = None
    onnx: str | None = None
    inputs: list[InputSpec] = Field(min_length=1)
    outputs: list[Identifier] = Field(min_length=1)
    export: ExportOptions = ExportOptions()
    depends_on: list[str] = Field(
        default_factory=list,
        description="Files the factory reads (checkpoints, configs): their bytes are part of the export cache key",
    )

    @model_validator(mode="after")
    def _one_source(self) -> ModelSpec:
        if (self.factory is None) == (self.onnx is None):
            raise ValueError("give exactly one of 'factory' (file.py:function) or 'onnx' (path to a .onnx file)")
        if self.onnx is not None and {"export", "depends_on"} & self.model_fields_set:
            raise ValueError("'export' and 'depends_on' apply to a 'factory' model only")
        if all(i.value is not None for i in self.inputs):
            raise ValueError("every input has a value: at least one must come from the data")
        given = {i.name: i.batch_axis for i in self.inputs if i.batch_axis is not None or i.value is not None}
        axes = default_axes({i.name: i.shape for i in self.inputs}, given)
        for spec in self.inputs:  # resolved once here: every batch temper forms reads it
            spec.batch_axis = axes[spec.name]
        return self


class DataSpec(Strict):
    calibration: DataSource | None = None
    evaluation: DataSource | None = None


class StepSpec(Strict):
    """One step: a single-key mapping (`- quantize: {...}`) or a bare name (`- simplify`)."""

    simplify: SimplifyOptions | None = None
    fix_shapes: FixShapesOptions | None = None
    fp16: Fp16Options | None = None
    quantize: QuantizeOptions | None = None

    @model_validator(mode="before")
    @classmethod
    def _bare_name(cls, value: Any) -> Any:
        if isinstance(value, str):
            return {value: {}}
        if isinstance(value, dict):
            return {k: ({} if v is None else v) for k, v in value.items()}
        return value

    @model_validator(mode="after")
    def _exactly_one(self) -> StepSpec:
        if len(self.model_fields_set) != 1:
            names = ", ".join(type(self).model_fields)
            raise ValueError(f"each step is exactly one of: {names}")
        return self

    @property
    def name(self) -> str:
        return next(iter(self.model_fields_set))

    @property
    def options(self) -> BaseModel:
        return getattr(self, self.name)


class MlflowTarget(Strict):
    """Where a passing candidate is registered; the tracking URI comes from --tracking-uri,
    MLFLOW_TRACKING_URI, or the embedded default sqlite:///mlflow.db."""

    registered_model: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
    alias: Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_-]*$")] = "candidate"
    experiment: str = "temper"


class ServingOptions(Strict):
    """Dynamic batching limits the serving runtime applies (written to the bundle's runtime.json)."""

    max_batch_size: PositiveInt = 16
    max_delay_ms: float = Field(
        10.0, ge=0, description="wait this long to fill a batch, only while requests keep arriving")
    max_queue: PositiveInt = 256
    timeout_s: float = Field(30.0, gt=0)
    pad: dict[str, int | float] = Field(
        default_factory=dict, description="inputs padded along axis 1 to the longest in a batch, with this value")


class PublishSpec(Strict):
    mlflow: MlflowTarget
    serving: ServingOptions = ServingOptions()


class CandidateSpec(Strict):
    """A named candidate: its own steps, applied to the baseline (the output of the shared steps)."""

    steps: list[StepSpec] = Field(min_length=1)


class Recipe(Strict):
    """A temper recipe, `version: 1`."""

    version: Literal[1]
    name: CandidateName
    target: Literal[presets.TARGETS] = Field(  # type: ignore[valid-type]
        presets.HOST, description="the machine the models are for: host (the one running temper) or a preset name; "
        "quantize steps with preset auto use its preset")
    model: ModelSpec
    data: DataSpec = DataSpec()
    steps: list[StepSpec] = Field(default_factory=list, description="shared steps: their output is the FP32 baseline")
    candidates: dict[CandidateName, CandidateSpec] = Field(min_length=1)
    validation: ValidateSpec | None = Field(None, alias="validate", description="gates every candidate must hold")
    select: Literal["fastest-passing", "smallest-passing"] = Field(
        "fastest-passing", description="which passing candidate wins (ties: the smaller file)")
    publish: PublishSpec | None = Field(
        None, description="register the selected candidate and its serving runtime in MLflow")

    @model_validator(mode="after")
    def _names(self) -> Recipe:
        if "baseline" in self.candidates:
            raise ValueError("'baseline' is reserved for the output of the shared steps; rename the candidate")
        known = {i.name: i.batch_axis for i in self.model.inputs}
        if len(known) != len(self.model.inputs):
            raise ValueError("model.inputs: input names must be unique")
        if self.publish is not None:
            if self.validation is None:
                raise ValueError("publish needs a validate section: "
                                 "only a candidate that passed its gates is published")
            stray = [name for name in self.publish.serving.pad if known.get(name, -1) != 0]
            if stray:
                raise ValueError(f"publish.serving.pad: '{stray[0]}' is not a model input ({', '.join(sorted(known))})"
                                 if stray[0] not in known else f"publish.serving.pad: '{stray[0]}' holds its rows on "
                                 f"axis {known[stray[0]]}: only inputs batched on axis 0 are padded (on axis 1)")
        return self
