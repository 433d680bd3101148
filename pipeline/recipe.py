"""The recipe schema: one pydantic model per section, so YAML, JSON Schema and Python share a single
definition. Every model forbids unknown keys. The per-step options models live in
pipeline.step_options; `StepSpec` here gathers them into the one-key mapping a step is."""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, BeforeValidator, Field, NonNegativeInt, PositiveInt, StringConstraints, model_validator

from temper.artifacts.layout import default_axes
from temper.pipeline import presets
from temper.pipeline.step_options import FixShapesOptions, Fp16Options, QuantizeOptions, SimplifyOptions, Strict

Identifier = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_.:/-]*$")]
# "path/to/file.py:function", resolved relative to the recipe's folder.
CallableRef = Annotated[str, StringConstraints(pattern=r"^.+\.py:[A-Za-z_][A-Za-z0-9_]*$")]


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


class DataSource(Strict):
    """A calibration or evaluation set: a file/folder loaded with HF `datasets` or numpy, or a callable."""

    path: str | None = Field(None, description="csv, json, jsonl, parquet, npy, npz, or a datasets save_to_disk folder")
    callable: CallableRef | None = Field(
        None, description="file.py:function returning a dict of arrays or a datasets.Dataset")
    split: str | None = Field(None, description="split of a save_to_disk DatasetDict")
    columns: list[str] | None = Field(None, description="columns to keep (default: all)")
    label: str | None = Field(None, description="column holding the labels (kept apart from model inputs)")
    preprocess: CallableRef | None = Field(
        None, description="file.py:function(columns: dict[str, list|ndarray]) -> dict[input name, ndarray]"
    )
    samples: PositiveInt | None = Field(None, description="use this many samples (after a seeded shuffle)")
    seed: int = 0
    batch_size: PositiveInt = 32

    @model_validator(mode="after")
    def _one_source(self) -> DataSource:
        if (self.path is None) == (self.callable is None):
            raise ValueError("give exactly one of 'path' or 'callable'")
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


BUILTIN_METRICS = ("top1", "topk", "f1", "cosine", "mse", "probe")
Provider = Literal["cpu", "cuda", "tensorrt"]  # the one list: recipes, report.json and `temper bench` take these


def _metric(value: Any) -> str:
    if not isinstance(value, str) or not (value in BUILTIN_METRICS or re.fullmatch(r".+\.py:[A-Za-z_]\w*", value)):
        raise ValueError(f"{value!r} is not a metric: use one of {', '.join(BUILTIN_METRICS)}, or file.py:function")
    return value


_PERCENT = re.compile(r"\s*([0-9]*\.?[0-9]+)\s*%\s*")


def percent(budget: str) -> float | None:
    """The number in a relative budget like '1%' (1.0), or None when `budget` is not one."""
    match = _PERCENT.fullmatch(budget)
    return float(match.group(1)) if match else None


def _budget(value: Any) -> float | str:
    """An absolute drop (0.01) or a relative one ("1%"), never negative: it is how much worse a candidate may be."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"{value!r} is not a budget: use a number like 0.01 (absolute) "
                         "or a string like '1%' (relative)")
    number = percent(value) if isinstance(value, str) else float(value)
    if number is None:
        raise ValueError(f"{value!r} is not a budget: a relative budget is a percentage like '1%'")
    if not math.isfinite(number):  # NaN fails every comparison (and is not JSON): every candidate would fail
        raise ValueError(f"{value!r} is not a budget: use a finite number like 0.01 (absolute) "
                         "or a string like '1%' (relative)")
    if number < 0:
        raise ValueError(f"{value!r} is negative: max_drop is how much worse than the baseline "
                         "a candidate may be (>= 0)")
    return value if isinstance(value, str) else float(value)


class AccuracyGate(Strict):
    """The candidate's metric on the evaluation set may fall at most `max_drop` below the baseline's."""

    metric: Annotated[str, BeforeValidator(_metric)] = Field(
        "top1", description="top1, topk (with k), f1 (macro), cosine / mse (to the baseline's outputs), "
        "probe (logistic regression on baseline outputs of the calibration set), or file.py:function")
    k: PositiveInt = Field(5, description="for metric: topk")
    output: str | None = Field(None, description="which model output the metric reads (default: the first)")
    max_drop: Annotated[float | str, BeforeValidator(_budget)]
    higher_is_better: bool | None = Field(None, description="required for a file.py:function metric")

    @model_validator(mode="after")
    def _direction(self) -> AccuracyGate:
        custom = self.metric not in BUILTIN_METRICS
        if custom and self.higher_is_better is None:
            raise ValueError("a file.py:function metric needs higher_is_better: true or false")
        if not custom and self.higher_is_better is not None:
            raise ValueError(f"higher_is_better is fixed for the built-in metric {self.metric}; remove it")
        if "k" in self.model_fields_set and self.metric != "topk":
            raise ValueError("k applies to metric: topk only")
        if isinstance(self.max_drop, str) and self.metric in ("mse", "cosine"):
            raise ValueError(f"a relative max_drop makes no sense for {self.metric}: the baseline scores "
                             f"{'0' if self.metric == 'mse' else '1'} against itself; give an absolute number")
        span = {"top1": 1.0, "topk": 1.0, "f1": 1.0, "probe": 1.0, "cosine": 2.0}.get(self.metric)
        relative = isinstance(self.max_drop, str)
        drop = float(self.max_drop.strip().rstrip("%")) if isinstance(self.max_drop, str) else self.max_drop
        if span is not None and (drop >= 100 if relative else drop >= span):
            raise ValueError(f"max_drop {self.max_drop!r} can never be exceeded "
                             f"({self.metric} spans at most {span:g}), "
                             "so this gate could never fail: give the drop you would accept, e.g. 0.01 or '1%'")
        return self


SliceName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")]


class FidelitySlice(Strict):
    """Part of one output gated on its own: `start:stop` along `axis`. A mixed-scale output (a detector's
    [batch, 4 + classes, anchors]: box pixels beside class scores) hides broken scores in a whole-output
    cosine, because the large part dominates the norm."""

    output: Identifier
    axis: int = Field(ge=0, description="the axis to cut (0 is the batch axis)")
    start: int = Field(0, ge=0)
    stop: int | None = Field(None, ge=1, description="exclusive (default: the end of the axis)")
    name: SliceName | None = Field(None, description="its name in gates and reports (default: output.axisA.start-stop)")
    cosine_min: float | None = Field(None, ge=-1, le=1)
    atol: float | None = Field(None, ge=0, description="largest allowed absolute error in the slice")
    rel_l2_max: float | None = Field(None, ge=0, description="largest allowed ||candidate - baseline|| / ||baseline||")

    @model_validator(mode="after")
    def _bounded(self) -> FidelitySlice:
        if self.stop is not None and self.stop <= self.start:
            raise ValueError(f"stop {self.stop} is not past start {self.start}: the slice would be empty")
        if self.cosine_min is None and self.atol is None and self.rel_l2_max is None:
            raise ValueError("a slice needs a bound to gate on: cosine_min, atol and/or rel_l2_max")
        return self

    @property
    def label(self) -> str:
        stop = "end" if self.stop is None else self.stop
        return self.name or f"{self.output}.axis{self.axis}.{self.start}-{stop}"


class FidelityGate(Strict):
    """Per-output agreement with the baseline on the evaluation set; any NaN/Inf always fails. `slices`
    gate parts of an output on their own bounds, beside (not instead of) the whole-output ones."""

    cosine_min: float | None = Field(None, ge=-1, le=1)
    atol: float | None = Field(None, ge=0, description="largest allowed absolute error per output")
    rel_l2_max: float | None = Field(
        None, ge=0, description="largest allowed relative error ||candidate - baseline|| / ||baseline|| per output")
    slices: list[FidelitySlice] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique(self) -> FidelityGate:
        labels = [s.label for s in self.slices]
        twice = next((label for i, label in enumerate(labels) if label in labels[:i]), None)
        if twice is not None:
            raise ValueError(f"two slices are named '{twice}': give each slice its own name")
        return self


class ThroughputSpec(Strict):
    """Batched throughput of the baseline and every candidate; `min_speedup` gates each batch size."""

    batch_sizes: list[PositiveInt] = Field(default_factory=lambda: [1, 8, 32], min_length=1)
    providers: list[Provider] = Field(default_factory=lambda: list[Provider](["cpu"]), min_length=1)
    duration_s: float = Field(
        3.0, gt=0, allow_inf_nan=False, description="timed seconds per model, batch size and provider")
    warmup_s: float = Field(0.5, ge=0, allow_inf_nan=False)
    min_speedup: float | None = Field(None, gt=0, description="candidate samples/s over baseline samples/s")
    speedup_at: list[PositiveInt] | None = Field(
        None, description="batch sizes the min_speedup gate applies to (default: every measured one)")
    confidence: float = Field(0.95, gt=0, lt=1, allow_inf_nan=False,
                              description="confidence level of the speedup interval a speed gate decides on")
    max_duration_s: float | None = Field(
        None, gt=0, allow_inf_nan=False,
        description="timed seconds per model, batch size and provider at most, while a speed gate's interval still "
                    "straddles min_speedup (default: 3 x duration_s)")
    inconclusive: Literal["fail", "pass"] = Field(
        "fail", description="what a speed gate still undecided at max_duration_s counts as")

    @model_validator(mode="after")
    def _gated_sizes(self) -> ThroughputSpec:
        stray = [b for b in self.speedup_at or () if b not in self.batch_sizes]
        if stray:
            raise ValueError(f"speedup_at {stray[0]} is not one of the measured batch_sizes {self.batch_sizes}")
        if self.speedup_at is not None and self.min_speedup is None:
            raise ValueError("speedup_at needs min_speedup")
        if self.max_duration_s is not None and self.max_duration_s < self.duration_s:
            raise ValueError(f"max_duration_s {self.max_duration_s:g} is less than duration_s {self.duration_s:g}: "
                             "it is the most a model is timed, the first duration_s included")
        return self

    @property
    def budget_s(self) -> float:
        return self.max_duration_s if self.max_duration_s is not None else 3 * self.duration_s

    @property
    def gated_sizes(self) -> list[int]:
        return (self.speedup_at or self.batch_sizes) if self.min_speedup is not None else []


class ValidateSpec(Strict):
    accuracy: AccuracyGate | None = None
    fidelity: FidelityGate | None = None
    throughput: ThroughputSpec | None = None


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
