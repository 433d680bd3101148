"""Accuracy-aware fallback for static INT8: keep the nodes that hurt most in float until the
recipe's accuracy budget and its fidelity gates hold on the evaluation set.

Order of work, cheapest first: the plain INT8 model; the SQNR ranking (one pass over a few
calibration batches); optionally each top suspect alone in float, measured with the real metric,
to re-rank them; then the top 1, 2, 4, ... nodes together until the budget holds, and a bisection
back down so as few nodes as possible stay float (each float island costs Q/DQ transitions). A block
(a repeated module such as `layer.3`) that is mostly float goes float whole. Every trial reuses one
calibration, so a trial costs one graph rewrite and one evaluation.

The best model found is always the step's output, with `tuning.json` beside it: the one that met
the budget with the fewest float nodes, else the one with the smallest drop (its gate then fails).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from temper.pipeline.cache import TUNING_FILE
from temper.pipeline.onnx_io import Batch
from temper.pipeline.step_options import FallbackOptions, QuantizeOptions
from temper.pipeline.steps.base import Scorer
from temper.pipeline.steps.quantize import quantize_static, sensitivity


@dataclass(frozen=True)
class Trial:
    kind: str  # plain | refine | cumulative
    float_nodes: list[str]  # kept float beyond the recipe's own exclude_nodes / exclude_op_types
    metric: float
    drop: float
    cosine: float
    samples_per_s: float | None
    passed: bool  # the accuracy budget and every fidelity gate hold


def tune(prepared: quantize_static.Prepared, dst: Path, options: QuantizeOptions, keep_float: list[str],
         feeds: list[Batch], scorer: Scorer, scratch: Path) -> None:
    """Write the best model found to `dst` and its record to `dst.parent / tuning.json`."""
    assert options.fallback is not None
    tuner = _Tuner(prepared, options, keep_float, scorer, scratch / "trial.onnx")
    ranking: list[sensitivity.NodeSensitivity] = []
    if not tuner.attempt("plain", []).passed:  # ranked even with no trial left: the report shows it
        ranking = [r for r in sensitivity.rank(prepared, options, first_samples(feeds, options.fallback.samples),
                                               scratch)
                   if r.node not in keep_float]
        order = tuner.refine([r.node for r in ranking], options.fallback)
        tuner.accumulate(order, _blocks(ranking))
    best = tuner.best()
    # trials share one file: the best is rewritten (one graph rewrite) rather than copied per trial
    quantize_static.write(prepared, dst, options, sorted({*keep_float, *best.float_nodes}))
    record = {
        "metric": scorer.metric, "baseline_metric": scorer.baseline_metric, "allowed_drop": scorer.allowed_drop,
        "met": best.passed, "best": tuner.trials.index(best), "max_trials": options.fallback.max_trials,
        "trials": [asdict(t) for t in tuner.trials], "ranking": [r.as_dict() for r in ranking],
    }
    (dst.parent / TUNING_FILE).write_text(json.dumps(record, indent=2) + "\n")


class _Tuner:
    def __init__(self, prepared: quantize_static.Prepared, options: QuantizeOptions, keep_float: list[str],
                 scorer: Scorer, path: Path) -> None:
        self.prepared, self.options, self.keep_float = prepared, options, keep_float
        self.scorer, self.path = scorer, path
        self.trials: list[Trial] = []
        self.tried: dict[frozenset[str], Trial] = {}

    @property
    def done(self) -> bool:
        assert self.options.fallback is not None
        return any(t.passed for t in self.trials) or len(self.trials) >= self.options.fallback.max_trials

    def attempt(self, kind: str, nodes: list[str]) -> Trial:
        """Quantize with `nodes` kept float and score it; a set tried before costs nothing."""
        key = frozenset(nodes)
        if key in self.tried:
            return self.tried[key]
        quantize_static.write(self.prepared, self.path, self.options, sorted({*self.keep_float, *nodes}))
        score = self.scorer.score(self.path)
        passed = score.drop <= self.scorer.allowed_drop and not score.fidelity_failed
        trial = Trial(kind, sorted(nodes), score.metric, score.drop, score.cosine, self.scorer.speed(self.path), passed)
        self.trials.append(trial)
        self.tried[key] = trial
        return trial

    def refine(self, order: list[str], fallback: FallbackOptions) -> list[str]:
        """Re-rank the top `fallback.refine` suspects by the drop measured with each alone in float."""
        measured: dict[str, float] = {}
        for node in order[: fallback.refine]:
            if self.done:
                break
            measured[node] = self.attempt("refine", [node]).drop
        return sorted(measured, key=measured.__getitem__) + [n for n in order if n not in measured]

    def accumulate(self, order: list[str], blocks: dict[str, list[str]]) -> None:
        """Top 1, 2, 4, ... nodes in float until the budget holds, then bisect to the fewest that hold it."""
        failing, passing = 0, None
        for count in _doubling(len(order)):
            if self.done:
                break
            if self.attempt("cumulative", _whole_blocks(order[:count], blocks)).passed:
                passing = count
            else:
                failing = count
        while passing is not None and passing - failing > 1 and len(self.trials) < self.options.fallback.max_trials:
            middle = (failing + passing) // 2
            if self.attempt("cumulative", _whole_blocks(order[:middle], blocks)).passed:
                passing = middle
            else:
                failing = middle

    def best(self) -> Trial:
        passed = [t for t in self.trials if t.passed]
        if passed:
            return min(passed, key=lambda t: (len(t.float_nodes), -(t.samples_per_s or 0.0)))
        return min(self.trials, key=lambda t: t.drop)


def _doubling(n: int) -> Iterator[int]:
    count = 1
    while count < n:
        yield count
        count *= 2
    if n:
        yield n


def _blocks(ranking: list[sensitivity.NodeSensitivity]) -> dict[str, list[str]]:
    """Quantized nodes per named block (nodes outside any block are never grouped)."""
    blocks: dict[str, list[str]] = {}
    for r in ranking:
        if r.block:
            blocks.setdefault(r.block, []).append(r.node)
    return blocks


def _whole_blocks(nodes: list[str], blocks: dict[str, list[str]]) -> list[str]:
    """`nodes`, plus every node of a block that already has at least two and half of its nodes chosen."""
    chosen = set(nodes)
    for members in blocks.values():
        inside = chosen.intersection(members)
        if len(inside) >= 2 and 2 * len(inside) >= len(members):
            chosen.update(members)
    return sorted(chosen)


def first_samples(feeds: list[Batch], samples: int) -> list[Batch]:
    """The leading calibration batches holding at least `samples` samples (all of them if fewer)."""
    taken, count = [], 0
    for feed in feeds:
        if count >= samples:
            break
        taken.append(feed)
        count += len(next(iter(feed.values())))
    return taken
