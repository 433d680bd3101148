"""The recipe's `validate:` section (accuracy, fidelity and throughput gates): owned here, where the
gates are measured, so validators/ needs nothing of pipeline/; pipeline/recipe.py composes it."""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field, PositiveInt, StringConstraints, model_validator

from temper.artifacts.core.strict import Identifier, Strict
from temper.artifacts.engines.providers import Provider

BUILTIN_METRICS = ("top1", "topk", "f1", "cosine", "mse", "probe")


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


def _cosine_bound(value: float | None) -> float | None:
    if value is not None and value <= -1:
        raise ValueError(f"{value:g} can never be missed (a cosine is never below -1), so this gate could never fail: "
                         "give the agreement you need, e.g. 0.99")
    return value


def _error_bound(value: float | None) -> float | None:
    if value is not None and math.isinf(value):
        raise ValueError(f"{value!r} can never be exceeded (no finite error exceeds it, and NaN or Inf fails on its "
                         "own), so this gate could never fail: give the largest error you accept, e.g. 0.05")
    return value


CosineMin = Annotated[float | None, Field(ge=-1, le=1), AfterValidator(_cosine_bound)]
ErrorMax = Annotated[float | None, Field(ge=0), AfterValidator(_error_bound)]
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
    cosine_min: CosineMin = None
    atol: ErrorMax = Field(None, description="largest allowed absolute error in the slice")
    rel_l2_max: ErrorMax = Field(None, description="largest allowed ||candidate - baseline|| / ||baseline||")

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

    cosine_min: CosineMin = None
    atol: ErrorMax = Field(None, description="largest allowed absolute error per output")
    rel_l2_max: ErrorMax = Field(
        None, description="largest allowed relative error ||candidate - baseline|| / ||baseline|| per output")
    row_cosine_min: CosineMin = Field(
        None, description="the bound on each index of an output's leading non-batch axis, when it has at most 256 "
                          "(a detector's box and class rows, each on its own): the worst row is gated "
                          "(default: cosine_min)")
    rows: bool = Field(True, description="gate each output's worst row (row_cosine_min, default cosine_min); false: "
                                         "whole outputs and slices only")
    slices: list[FidelitySlice] = Field(default_factory=list)

    @property
    def row_bound(self) -> float | None:
        """The bound each output's worst row is gated on: row_cosine_min, else cosine_min; None: not gated."""
        if not self.rows:
            return None
        return self.row_cosine_min if self.row_cosine_min is not None else self.cosine_min

    @model_validator(mode="after")
    def _unique(self) -> FidelityGate:
        if not self.rows and self.row_cosine_min is not None:
            raise ValueError("row_cosine_min bounds the worst row, and rows: false turns that gate off: "
                             "remove one of them")
        labels = [s.label for s in self.slices]
        twice = next((label for i, label in enumerate(labels) if label in labels[:i]), None)
        if twice is not None:
            raise ValueError(f"two slices are named '{twice}': give each slice its own name")
        return self


class ThroughputSpec(Strict):
    """Batched throughput of the baseline and every candidate; `min_speedup` gates each batch size."""

    batch_sizes: list[PositiveInt] = Field(default_factory=lambda: [1, 8, 32], min_length=1)
    providers: list[Provider] = Field(
        default_factory=lambda: list[Provider](["cpu"]), min_length=1,
        description="the engines every model is paired with (artifacts/engines/providers.py); the first is the "
                    "reference every pair's speedup is measured against (the baseline on it)")
    duration_s: float = Field(
        3.0, gt=0, allow_inf_nan=False, description="timed seconds per model, batch size and provider")
    warmup_s: float = Field(0.5, ge=0, allow_inf_nan=False)
    min_speedup: float | None = Field(None, gt=0, allow_inf_nan=False,
                                      description="a pair's samples/s over the baseline's on the first provider")
    speedup_at: list[PositiveInt] | None = Field(
        None, description="batch sizes the min_speedup gate applies to (default: every measured one)")
    confidence: float = Field(
        0.95, gt=0, lt=1, allow_inf_nan=False,
        description="confidence level of the speedup interval the speed gate and selection decide on")
    max_duration_s: float | None = Field(
        None, gt=0, allow_inf_nan=False,
        description="timed seconds per model, batch size and provider at most, while a speedup interval still "
                    "straddles min_speedup, or 1.0 at the ranking batch size (default: 3 x duration_s)")
    inconclusive: Literal["fail", "pass"] = Field(
        "fail", description="what a speed gate still undecided at max_duration_s counts as")
    session_search: bool = Field(
        False, description="before the gates, try each model's few session settings that matter on each provider "
                           "(validators/session_search.py) and keep one only where its speedup interval over the "
                           "default lies above 1.0; cached per model and host")
    session_search_s: float = Field(
        4.0, gt=0, allow_inf_nan=False,
        description="wall-clock seconds of the session settings search per model and provider at most, building "
                    "its sessions and every setting and batch size together (one round at each batch size always "
                    "runs; rows the budget leaves undecided keep the default: docs/recipes.md)")

    @model_validator(mode="after")
    def _gated_sizes(self) -> ThroughputSpec:
        for key, values in (("batch_sizes", self.batch_sizes), ("providers", self.providers)):
            twice = next((v for i, v in enumerate(values) if v in values[:i]), None)
            if twice is not None:
                raise ValueError(f"{key} lists {twice!r} twice: each is measured once; remove the repeat")
        if self.speedup_at is not None and not self.speedup_at:
            raise ValueError("speedup_at: [] gates no batch size: omit speedup_at to gate every measured batch size")
        if "inconclusive" in self.model_fields_set and self.min_speedup is None:
            raise ValueError("inconclusive decides an undecided min_speedup gate, and there is none: "
                             "add min_speedup or remove inconclusive")
        stray = [b for b in self.speedup_at or () if b not in self.batch_sizes]
        if stray:
            raise ValueError(f"speedup_at {stray[0]} is not one of the measured batch_sizes {self.batch_sizes}")
        if self.speedup_at is not None and self.min_speedup is None:
            raise ValueError("speedup_at needs min_speedup")
        if "session_search_s" in self.model_fields_set and not self.session_search:
            raise ValueError("session_search_s is the session settings search's budget, and there is no search: "
                             "add session_search: true or remove session_search_s")
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
