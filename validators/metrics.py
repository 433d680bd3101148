"""Accuracy-gate metrics: what "how good is this candidate" means, and which way is better.

Every metric scores one model output over the evaluation set. Task metrics (top1, topk, f1)
compare it with labels; cosine and mse compare it with the FP32 baseline's same output; probe
trains a classifier on the baseline's outputs of the calibration set, a real downstream task
for embedding models that have no class scores.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from temper.artifacts.core.callables import call_user, load_callable
from temper.artifacts.core.errors import RecipeError
from temper.validators.spec import AccuracyGate, percent

KEY = "validate.accuracy.metric"
EMBEDDING_ADVICE = "for embeddings use metric: cosine or probe"


@dataclass(frozen=True)
class MetricData:
    outputs: np.ndarray  # the candidate's chosen output over the evaluation set
    labels: np.ndarray | None  # evaluation labels
    baseline: np.ndarray  # the baseline's same output over the evaluation set
    train_outputs: np.ndarray | None  # the BASELINE's output over the calibration set (for probe)
    train_labels: np.ndarray | None  # calibration labels (for probe)


@dataclass(frozen=True)
class Metric:
    name: str
    higher_is_better: bool
    needs_labels: bool
    needs_training: bool  # probe: needs labelled calibration data as well
    check: Callable[[np.ndarray, np.ndarray | None], str | None] = field(repr=False, compare=False)
    compute: Callable[[MetricData], float] = field(repr=False, compare=False)

    def fits(self, outputs: np.ndarray, labels: np.ndarray | None) -> str | None:
        """None if this metric can score `outputs` against `labels`, else one line saying why not and what to use.

        Asked before any scoring so that a mismatched recipe (top1 on an embedding) is a clear
        error instead of a meaningless number.
        """
        if self.needs_labels and labels is None:
            return f"metric {self.name} needs labels: set data.evaluation.label"
        return self.check(np.asarray(outputs), None if labels is None else np.asarray(labels))

    def score(self, data: MetricData) -> float:
        """The metric's value for `data.outputs`; call `fits` first (scoring assumes it passed)."""
        return float(self.compute(data))


def resolve(spec: AccuracyGate, base: Path, recipe_file: str) -> Metric:
    """The metric a recipe's accuracy gate names: a built-in, or a user's file.py:function."""
    name = spec.metric
    if name == "top1":
        return Metric(name, True, True, False, _class_scores(name, 1), _top1)
    if name == "topk":
        k = spec.k
        return Metric(name, True, True, False, _class_scores(name, k), lambda d: _topk(d, k))
    if name == "f1":
        return Metric(name, True, True, False, _class_scores(name, 1), _f1)
    if name == "cosine":
        return Metric(name, True, False, False, _rows_as_vectors, _cosine)
    if name == "mse":
        return Metric(name, False, False, False, lambda outputs, labels: None, _mse)
    if name == "probe":
        return Metric(name, True, True, True, _probe_fits, _probe)
    return _custom(spec, base, recipe_file)


def drop(metric: Metric, baseline_value: float, candidate_value: float) -> float:
    """How much worse the candidate is, in metric units: positive = worse, negative = better."""
    if metric.higher_is_better:
        return baseline_value - candidate_value
    return candidate_value - baseline_value


def allowed_drop(max_drop: float | str, baseline_value: float) -> float:
    """The absolute budget: a number as is; "1%" of the baseline's value (its magnitude, whatever its sign)."""
    if isinstance(max_drop, str):
        number = percent(max_drop)
        if number is None:
            raise ValueError(f"{max_drop!r} is not a relative budget like '1%'")
        return number / 100 * abs(baseline_value)
    return float(max_drop)


def _class_scores(name: str, k: int) -> Callable[[np.ndarray, np.ndarray | None], str | None]:
    """`fits` for metrics that read one score per class.

    Rule: the output is 2-D [rows, C], the labels are integer class ids, one per row, and C
    equals the number of classes the labels imply (max label + 1); topk also needs k < C.
    C may exceed that when the evaluation set lacks the highest classes, if the output still
    reads as class scores: at least half its rows peak at a class the labels use. A 384-wide
    embedding scored against 2 classes almost never does, which is what tells the two apart.
    """

    def check(outputs: np.ndarray, labels: np.ndarray | None) -> str | None:
        assert labels is not None  # Metric.fits reports missing labels first
        if outputs.ndim != 2:
            return (f"{name} needs a 2-D output [rows, classes] with one score per class, "
                    f"but the output has shape {list(outputs.shape)}; {EMBEDDING_ADVICE}")
        if labels.ndim != 1 or len(labels) != len(outputs):
            return (f"{name} needs one label per row: labels have shape {list(labels.shape)}, "
                    f"the output {len(outputs)} rows")
        if not np.issubdtype(labels.dtype, np.integer) or (labels.size and labels.min() < 0):
            return f"{name} needs integer class ids 0..C-1 as labels, got {labels.dtype} labels; or use metric: probe"
        classes = int(labels.max()) + 1 if labels.size else 0
        columns = outputs.shape[1]
        scores_like = columns > classes and float(np.mean(outputs.argmax(axis=1) < classes)) >= 0.5
        if columns != classes and not scores_like:
            return (f"{name} needs one score per class, but the output has {columns} columns and the labels "
                    f"{classes} classes (max label + 1); {EMBEDDING_ADVICE}")
        if k >= columns:
            return f"topk with k={k} needs more than k classes, but the output has {columns}; lower k or use top1"
        return None

    return check


def _top1(data: MetricData) -> float:
    return float(np.mean(np.argmax(data.outputs, axis=1) == data.labels))


def _topk(data: MetricData, k: int) -> float:
    best = np.argsort(-np.asarray(data.outputs), axis=1, kind="stable")[:, :k]
    return float(np.mean(np.any(best == np.asarray(data.labels)[:, None], axis=1)))


def _f1(data: MetricData) -> float:
    from sklearn.metrics import f1_score

    predicted = np.argmax(data.outputs, axis=1)
    return float(f1_score(data.labels, predicted, average="macro", zero_division=0))


def _rows_as_vectors(outputs: np.ndarray, labels: np.ndarray | None) -> str | None:
    if outputs.ndim < 2:
        return f"cosine compares each row as a vector, but the output has shape {list(outputs.shape)}; use metric: mse"
    return None


def _paired(data: MetricData) -> tuple[np.ndarray, np.ndarray]:
    """Candidate and baseline as float64 [rows, features]; shapes must match exactly."""
    got, ref = np.asarray(data.outputs, np.float64), np.asarray(data.baseline, np.float64)
    if got.shape != ref.shape:
        raise ValueError(f"candidate output shape {list(got.shape)} differs from the baseline's {list(ref.shape)}")
    return got.reshape(len(got), -1), ref.reshape(len(ref), -1)


def _cosine(data: MetricData) -> float:
    """Mean of per-row cosines; two all-zero rows agree (1), one all-zero row does not (0), as in fidelity.compare."""
    got, ref = _paired(data)
    norms = np.linalg.norm(got, axis=1) * np.linalg.norm(ref, axis=1)
    dots = np.einsum("ij,ij->i", got, ref)
    both_zero = np.all(got == 0, axis=1) & np.all(ref == 0, axis=1)
    cosines = np.where(norms > 0, dots / np.where(norms > 0, norms, 1), both_zero.astype(np.float64))
    return float(np.mean(cosines))


def _mse(data: MetricData) -> float:
    got, ref = _paired(data)
    return float(np.mean((got - ref) ** 2))


def _probe_fits(outputs: np.ndarray, labels: np.ndarray | None) -> str | None:
    assert labels is not None  # Metric.fits reports missing labels first
    if outputs.ndim != 2:
        return ("probe trains a classifier on row vectors [rows, features], "
                f"but the output has shape {list(outputs.shape)}")
    if labels.ndim != 1 or len(labels) != len(outputs):
        return f"probe needs one label per row: labels have shape {list(labels.shape)}, the output {len(outputs)} rows"
    return None


def _probe(data: MetricData) -> float:
    """Accuracy of a logistic regression trained on the baseline's calibration outputs, tested on `outputs`.

    The classifier is the same for baseline and candidate, so a lower score means the
    candidate's outputs moved away from what the baseline's downstream task relies on.
    """
    from sklearn.linear_model import LogisticRegression

    if data.train_outputs is None or data.train_labels is None:
        raise ValueError("metric probe needs labelled calibration data: "
                         "set data.calibration and data.calibration.label")
    if len(np.unique(data.train_labels)) < 2:
        raise ValueError("metric probe needs at least two classes among the calibration labels")
    probe = LogisticRegression(max_iter=1000).fit(data.train_outputs, data.train_labels)
    # a row with NaN or Inf (INT8 attention on another engine gave 282 of them on MiniLM) is a wrong
    # answer, not a reason to stop the run: the candidate's drop shows it and its gate fails
    finite = np.isfinite(data.outputs).all(axis=1)
    right = np.zeros(len(data.outputs), dtype=bool)
    if finite.any():
        right[finite] = probe.predict(data.outputs[finite]) == np.asarray(data.labels)[finite]
    return float(np.mean(right))


def _custom(spec: AccuracyGate, base: Path, recipe_file: str) -> Metric:
    """A user metric fn(outputs, labels, baseline) -> float; the recipe states its direction."""
    fn = load_callable(spec.metric, base, recipe_file, KEY)

    def compute(data: MetricData) -> float:
        value = call_user(fn, recipe_file, KEY, data.outputs, data.labels, data.baseline)
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
            raise RecipeError(recipe_file, KEY, f"{fn.__name__}() must return a number, got {type(value).__name__}")
        if not math.isfinite(value):
            raise RecipeError(recipe_file, KEY, f"{fn.__name__}() returned {value}; a metric must be a finite number")
        return float(value)

    assert spec.higher_is_better is not None  # the recipe schema requires it for a callable
    return Metric(spec.metric, spec.higher_is_better, False, False, lambda outputs, labels: None, compute)
