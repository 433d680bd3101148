"""The accuracy gate's reference side, shared by validation and by steps that aim at the budget
(the quantize fallback): the metric, the baseline's outputs and score, and the allowed drop."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from temper.artifacts.core.errors import RecipeError
from temper.artifacts.core.layout import AXIS0, Layout
from temper.calibration.sources import Dataset
from temper.validators import metrics
from temper.validators.evaluate import Kept, predict
from temper.validators.fidelity import compare_outputs, fidelity_gates
from temper.validators.spec import ValidateSpec
from temper.validators.throughput import measure

TRIAL_SPEED_S = 0.5  # a trial's speed is for its report line; the gates measure properly later


@dataclass(frozen=True)
class Score:
    """One model against the recipe's accuracy and fidelity gates on the evaluation set."""

    metric: float
    drop: float  # from the baseline; the accuracy gate holds when drop <= allowed_drop
    cosine: float  # the lowest cosine to the baseline over the outputs
    fidelity_failed: list[str]  # names of the fidelity gates that failed


@dataclass(frozen=True)
class Reference:
    """The baseline's side of the accuracy gate; `score` rates any model's outputs against it."""

    metric: metrics.Metric
    output: str
    labels: np.ndarray | None
    baseline_outputs: np.ndarray
    train: tuple[np.ndarray, np.ndarray] | None
    value: float
    allowed: float

    def score(self, outputs: dict[str, np.ndarray]) -> tuple[float, float]:
        """(metric, drop from the baseline) of a model's outputs over the evaluation set."""
        train_out, train_labels = self.train or (None, None)
        value = self.metric.score(metrics.MetricData(outputs[self.output], self.labels, self.baseline_outputs,
                                                     train_out, train_labels))
        return value, metrics.drop(self.metric, self.value, value)


def reference(spec: ValidateSpec, baseline: Path, baseline_outputs: dict[str, np.ndarray], outputs: list[str],
              evaluation: Dataset, calibration: Dataset | None, batch_size: int, base: Path, file: str,
              layout: Layout = AXIS0, kept: Kept | None = None) -> Reference:
    """Resolve the metric and check it fits the baseline's outputs and labels, before anything is scored.
    `kept`: where the baseline's outputs over the calibration set (a probe's training set) are kept."""
    assert spec.accuracy is not None
    metric = metrics.resolve(spec.accuracy, base, file)
    output = spec.accuracy.output or outputs[0]
    if output not in baseline_outputs:
        raise RecipeError(file, "validate.accuracy.output",
                          f"no output named '{output}'; outputs: {', '.join(baseline_outputs)}")
    reason = metric.fits(baseline_outputs[output], evaluation.labels)
    if reason:
        raise RecipeError(file, metrics.KEY, reason)
    train = None
    if metric.needs_training:
        if calibration is None or calibration.labels is None:
            raise RecipeError(file, metrics.KEY,
                              "metric probe trains on the baseline's outputs of the calibration set: "
                              "add data.calibration with a label column")
        train = predict(baseline, calibration.features, batch_size, layout, kept=kept)[output], calibration.labels
    own = baseline_outputs[output]
    value = metric.score(metrics.MetricData(own, evaluation.labels, own, *(train or (None, None))))
    return Reference(metric, output, evaluation.labels, own, train, value,
                     metrics.allowed_drop(spec.accuracy.max_drop, value))


class GateScorer:
    """The recipe's accuracy and fidelity gates as a step's Scorer (pipeline.steps.base.Scorer)."""

    def __init__(self, spec: ValidateSpec, baseline: Path, outputs: list[str], evaluation: Dataset,
                 calibration: Dataset | None, batch_size: int, base: Path, file: str,
                 layout: Layout = AXIS0, kept: Kept | None = None) -> None:
        self.spec, self.evaluation, self.batch_size, self.layout = spec, evaluation, batch_size, layout
        self.kept = kept  # trials' outputs too: the gates then read the kept trial's (and the plain model's) back
        self.baseline_outputs = predict(baseline, evaluation.features, batch_size, layout, kept=kept)
        self.reference = reference(spec, baseline, self.baseline_outputs, outputs, evaluation, calibration,
                                   batch_size, base, file, layout, kept)
        self.metric = self.reference.metric.name
        self.baseline_metric = self.reference.value
        self.allowed_drop = self.reference.allowed

    def score(self, model: Path) -> Score:
        out = predict(model, self.evaluation.features, self.batch_size, self.layout, kept=self.kept)
        metric, drop = self.reference.score(out)
        comparisons = compare_outputs(self.baseline_outputs, out, self.spec)  # with the recipe's slices
        failed = [g.name for g in fidelity_gates(comparisons, self.spec) if not g.passed]
        return Score(metric, drop, min(c.cosine for c in comparisons if c.slice is None), failed)

    def speed(self, model: Path) -> float | None:
        throughput = self.spec.throughput
        if throughput is None:
            return None
        size = max(throughput.batch_sizes)
        sample = {k: v[:size] for k, v in self.evaluation.features.items()}
        return measure(model, sample, size, "cpu", TRIAL_SPEED_S, min(throughput.warmup_s, TRIAL_SPEED_S),
                       layout=self.layout).samples_per_s
