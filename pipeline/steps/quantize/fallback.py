"""Accuracy-aware fallback for static INT8: keep the nodes that hurt most in float until the
recipe's accuracy budget and its fidelity gates hold on the evaluation set.

Order of work, cheapest first: the plain INT8 model; then the configurations that fix most real
models without any float node (per-channel weights when the step had per-tensor, then percentile
calibration when it had minmax; each costs one calibration and one evaluation, the best is kept and
the rest of the search starts from it); the SQNR ranking (one pass over a few
calibration batches); optionally each top suspect alone in float, measured with the real metric,
to re-rank them; then the top 1, 2, 4, ... nodes together until the budget holds, and a bisection
back down so as few nodes as possible stay float (each float island costs Q/DQ transitions). A block
(a repeated module such as `layer.3`) that is mostly float goes float whole. Every trial reuses one
calibration, so a trial costs one graph rewrite and one evaluation. A node set whose graph is byte for
byte one tried already (a MaxPool behind a Relu already in float has no Q/DQ of its own to drop) is
that trial again, not a new one: max_trials counts distinct models.

The floor: a trial that would leave fewer quantized compute nodes (the graph census) than
`min_quantized` of the plain model's is never scored, so the budget can never be "met" by putting the
model back in float; the search stops at the floor and the record says the budget is not reachable in
INT8. Each trial reports its progress (trial k of n, nodes in float, quantized nodes left, its drop).

The best model found is always the step's output, with `tuning.json` beside it: among the trials that
met the budget, the one with the most quantized compute nodes (where INT8's speed comes from), then the
most faithful (highest cosine), then the fewest float nodes; else the one with the smallest drop (its
gate then fails). Fidelity decides between equally quantized trials because a trial's speed is a
half-second reading: on MiniLM, 54 float nodes at cosine 0.961 and 64 at 0.985 both left 42 compute
nodes quantized.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import onnx

from temper.artifacts.core.errors import StepFailed
from temper.artifacts.core.layout import AXIS0, Layout
from temper.artifacts.core.onnx_io import Batch
from temper.artifacts.formats.integrity import content_digests
from temper.pipeline.cache import TUNING_FILE
from temper.pipeline.quantize_backends import quantize_static
from temper.pipeline.quantize_backends.ort import OrtOptions
from temper.pipeline.step_options import FallbackOptions
from temper.pipeline.steps.base import Scorer
from temper.pipeline.steps.quantize import census_check, sensitivity
from temper.validators.census import of_file


@dataclass(frozen=True)
class Trial:
    kind: str  # plain | configuration | refine | cumulative
    float_nodes: list[str]  # kept float beyond the recipe's own exclude_nodes / exclude_op_types
    metric: float
    drop: float
    cosine: float
    samples_per_s: float | None
    passed: bool  # the accuracy budget and every fidelity gate hold
    quantized: int  # quantized compute nodes left in the trial's graph (validators/census.py)
    configuration: dict[str, Any] = field(default_factory=dict)  # options changed from the step's ({}: its own)


@dataclass(frozen=True)
class Setup:
    """One configuration the trials quantize with: its calibrated model, options and recipe float nodes."""

    prepared: quantize_static.Prepared
    options: OrtOptions
    keep_float: list[str]


# Given the step's options changed by a configuration, the calibrated model for it (a new calibration).
Prepare = Callable[[OrtOptions], tuple[quantize_static.Prepared, list[str]]]


def tune(prepared: quantize_static.Prepared, dst: Path, options: OrtOptions, keep_float: list[str],
         feeds: list[Batch], scorer: Scorer, scratch: Path, progress: Callable[[str], None] = lambda _: None,
         prepare: Prepare | None = None, layout: Layout = AXIS0, log: Callable[[str], None] = lambda _: None) -> None:
    """Write the best model found to `dst` and its record to `dst.parent / tuning.json`. With `prepare`
    (and fallback.configurations), the configurations are tried before any node goes float. `progress`
    hears what is being done now, `log` each trial and configuration once scored (a line in a CI log)."""
    assert options.fallback is not None
    tuner = _Tuner(prepared, options, keep_float, scorer, scratch / "trial.onnx", progress, log)
    ranking: list[sensitivity.NodeSensitivity] = []
    plain = tuner.attempt("plain", [])
    assert plain is not None  # the plain model is never below the floor it sets
    if not plain.passed:  # ranked even with no trial left: the report shows it
        if prepare is not None and options.fallback.configurations:
            tuner.configure(prepare)
        if not any(t.passed for t in tuner.trials):  # a configuration alone may have met the budget
            setup = tuner.setup
            progress(f"fallback: ranking nodes by SQNR on {options.fallback.samples} calibration samples")
            ranking = [r for r in sensitivity.rank(setup.prepared, setup.options,
                                                   first_samples(feeds, options.fallback.samples, layout), scratch,
                                                   progress=lambda note: progress(f"fallback: ranking: {note}"))
                       if r.node not in setup.keep_float]
            log(f"fallback: ranked {len(ranking)} quantized nodes by SQNR")
            order = tuner.refine([r.node for r in ranking], options.fallback)
            tuner.accumulate(order, _blocks(ranking))
    best = tuner.best()
    kept = tuner.setups[_key(best.configuration)]
    # trials share one file: the best is rewritten (one graph rewrite) rather than copied per trial
    quantize_static.write(kept.prepared, dst, kept.options, sorted({*kept.keep_float, *best.float_nodes}))
    record = {
        "metric": scorer.metric, "baseline_metric": scorer.baseline_metric, "allowed_drop": scorer.allowed_drop,
        "met": best.passed, "best": tuner.trials.index(best), "max_trials": options.fallback.max_trials,
        "min_quantized": options.fallback.min_quantized, "floor": tuner.floor, "floor_reached": tuner.floor_reached,
        "configuration": tuner.configuration, "configurations": tuner.configurations,
        "trials": [asdict(t) for t in tuner.trials], "same_graph": tuner.same_graph,
        "ranking": [r.as_dict() for r in ranking],
    }
    (dst.parent / TUNING_FILE).write_text(json.dumps(record, indent=2) + "\n")


def alternatives(options: OrtOptions) -> list[dict[str, Any]]:
    """The configuration changes to try, in order, each on top of the best so far: the fixes that took a
    real OCR model from cosine 0.50 to 0.95 with no node in float, where the SQNR suspects moved it 0.0001."""
    changes: list[dict[str, Any]] = []
    if not options.per_channel:
        changes.append({"per_channel": True})
    if options.calibration == "minmax":
        changes.append({"calibration": "percentile"})
    return changes


def _sortable(drop: float) -> float:
    """A NaN drop (a metric of outputs that went all zero or non-finite) is the worst drop."""
    return math.inf if math.isnan(drop) else drop


def _better(drop: float, than: float) -> bool:
    """A configuration is kept when it lowers the drop by more than 1% of the best so far: a change
    within the metric's noise is not worth another calibration's difference from the recipe."""
    new, best = _sortable(drop), _sortable(than)
    if math.isinf(best):
        return math.isfinite(new)
    return new < best - max(1e-9, 0.01 * abs(best))


def _key(configuration: dict[str, Any]) -> str:
    return json.dumps(configuration, sort_keys=True)


def graph_digest(path: Path) -> tuple[str, ...]:
    """A trial file's sha256, and its external data's: node sets that write the same bytes are one model."""
    return tuple(content_digests(path, onnx.load(str(path), load_external_data=False)))


def count_quantized(path: Path) -> int:
    """Quantized compute nodes in the graph at `path` (the census), what the floor counts."""
    return of_file(path).quantized


class _Tuner:
    def __init__(self, prepared: quantize_static.Prepared, options: OrtOptions, keep_float: list[str],
                 scorer: Scorer, path: Path, progress: Callable[[str], None] = lambda _: None,
                 log: Callable[[str], None] = lambda _: None) -> None:
        self.prepared, self.options, self.keep_float = prepared, options, keep_float
        self.scorer, self.path, self.progress, self.log = scorer, path, progress, log
        self.trials: list[Trial] = []
        self.tried: dict[frozenset[str], Trial | None] = {}
        self.graphs: dict[tuple[str, ...], Trial] = {}  # each trial by its graph's bytes (graph_digest)
        self.same_graph: list[dict[str, Any]] = []  # node sets that wrote a trial's graph again
        self.configuration: dict[str, Any] = {}  # the changes the trials now quantize with
        self.setups = {_key({}): Setup(prepared, options, keep_float)}
        self.configurations: list[dict[str, Any]] = []  # each configuration round: changes and its score
        self.floor = 0  # quantized nodes a trial must keep: min_quantized of the plain model's, rounded up
        self.floor_reached = False  # a trial was refused for leaving fewer: more float would not be INT8

    @property
    def done(self) -> bool:
        return any(t.passed for t in self.trials) or self.spent >= self._max_trials

    @property
    def spent(self) -> int:
        """Trials counted against max_trials: configuration rounds come beside it."""
        return sum(t.kind != "configuration" for t in self.trials)

    @property
    def _max_trials(self) -> int:
        assert self.options.fallback is not None
        return self.options.fallback.max_trials

    def attempt(self, kind: str, nodes: list[str]) -> Trial | None:
        """Quantize with `nodes` kept float and score it; a set tried before costs nothing. None: the
        graph would keep fewer quantized nodes than the floor, so it is not scored (not a trial)."""
        key = frozenset(nodes)
        if key in self.tried:
            return self.tried[key]
        assert self.options.fallback is not None
        quantize_static.write(self.prepared, self.path, self.options, sorted({*self.keep_float, *nodes}))
        digest = graph_digest(self.path)
        if (same := self.graphs.get(digest)) is not None:
            self.tried[key] = same
            self.same_graph.append({"float_nodes": sorted(nodes), "trial": self.trials.index(same)})
            self.log(f"fallback: {len(nodes)} nodes in float write trial {self.trials.index(same) + 1}'s graph "
                          "byte for byte: not a new trial")
            return same
        quantized = count_quantized(self.path)
        if not self.trials:  # the plain model: nothing quantized is a failed build, not a trial
            if not quantized:
                census_check.require_quantized(self.path, "ONNX Runtime's quantizer")  # raises, saying why
            self.floor = math.ceil(self.options.fallback.min_quantized * quantized)
        if quantized < self.floor:
            self.floor_reached = True
            self.tried[key] = None
            self.log(f"fallback: {len(nodes)} nodes in float would leave {quantized} quantized nodes, "
                          f"below the floor of {self.floor}: not tried")
            return None
        self.progress(f"fallback trial {self.spent + 1} of {self._max_trials}: "
                      f"{len(nodes)} nodes in float, {quantized} quantized nodes left, scoring")
        score = self.scorer.score(self.path)
        passed = score.drop <= self.scorer.allowed_drop and not score.fidelity_failed
        trial = Trial(kind, sorted(nodes), score.metric, score.drop, score.cosine, self.scorer.speed(self.path), passed,
                      quantized, self.configuration)
        self.trials.append(trial)
        self.tried[key] = self.graphs[digest] = trial
        self.log(f"fallback trial {self.spent} of {self._max_trials}: {len(nodes)} nodes "
                 f"in float, {quantized} quantized nodes left, {self.scorer.metric} drop {score.drop:.4f} "
                 f"({'meets' if passed else 'misses'} {self.scorer.allowed_drop:.4f})")
        return trial

    @property
    def setup(self) -> Setup:
        return self.setups[_key(self.configuration)]

    def configure(self, prepare: Prepare) -> None:
        """Try each configuration change on top of the best so far (its plain model, one calibration and
        one evaluation each, beside max_trials); the node search then starts from the best. One that
        meets the budget becomes a trial of kind `configuration` and ends the search."""
        plain = self.trials[0]
        best_changes: dict[str, object] = {}
        best_drop, best_trial = plain.drop, None
        for step in alternatives(self.options):
            changes = {**best_changes, **step}
            shown = ", ".join(f"{k}: {v}" for k, v in changes.items())
            self.progress(f"fallback: configuration {shown}: calibrating")
            options = self.options.model_copy(update=changes)
            try:
                refusal = (quantize_static.unbinnable(self.prepared, options.calibration)
                           if self.options.calibration == "minmax" and options.calibration != "minmax" else None)
                if refusal is not None:
                    raise StepFailed(refusal)
                prepared, keep_float = prepare(options)
            except StepFailed as exc:  # percentile's histograms refuse -inf (an attention mask's): skip it
                self.configurations.append({"changes": changes, "error": str(exc), "passed": False})
                self.log(f"fallback: configuration {shown}: skipped, it does not calibrate ({exc})")
                continue
            self.setups[_key(changes)] = Setup(prepared, options, keep_float)
            quantize_static.write(prepared, self.path, options, keep_float)
            quantized = count_quantized(self.path)
            score = self.scorer.score(self.path)
            passed = score.drop <= self.scorer.allowed_drop and not score.fidelity_failed
            self.configurations.append({"changes": changes, "metric": score.metric, "drop": score.drop,
                                        "cosine": score.cosine, "quantized": quantized, "passed": passed})
            self.log(f"fallback: configuration {shown}: {quantized} quantized nodes, {self.scorer.metric} drop "
                     f"{score.drop:.4f} ({'meets' if passed else 'misses'} {self.scorer.allowed_drop:.4f})")
            if quantized < self.floor or not (passed or _better(score.drop, best_drop)):
                continue
            best_drop, best_changes = score.drop, changes
            best_trial = Trial("configuration", [], score.metric, score.drop, score.cosine,
                               self.scorer.speed(self.path), passed, quantized, changes)
            if passed:
                break
        if best_trial is not None:  # the kept model may be this configuration's plain one: a trial of its own
            self.trials.append(best_trial)
        self.configuration = best_changes
        setup = self.setup
        self.prepared, self.options, self.keep_float = setup.prepared, setup.options, setup.keep_float
        self.tried = {}  # the same float nodes on another configuration are another model

    def refine(self, order: list[str], fallback: FallbackOptions) -> list[str]:
        """Re-rank the top `fallback.refine` suspects by the drop measured with each alone in float."""
        measured: dict[str, float] = {}
        for node in order[: fallback.refine]:
            if self.done:
                break
            trial = self.attempt("refine", [node])
            if trial is not None:
                measured[node] = trial.drop
        return sorted(measured, key=measured.__getitem__) + [n for n in order if n not in measured]

    def accumulate(self, order: list[str], blocks: dict[str, list[str]]) -> None:
        """Top 1, 2, 4, ... nodes in float until the budget holds, then bisect to the fewest that hold it.
        A count past the floor is a ceiling: the search goes on below it, never beyond."""
        assert self.options.fallback is not None
        failing, passing, ceiling = 0, None, None
        for count in _doubling(len(order)):
            if self.done:
                break
            trial = self.attempt("cumulative", _whole_blocks(order[:count], blocks))
            if trial is None:
                ceiling = count
                break
            if trial.passed:
                passing = count
            else:
                failing = count
        while (passing is None and ceiling is not None and ceiling - failing > 1
               and self.spent < self._max_trials):
            middle = (failing + ceiling) // 2  # the most float nodes the floor allows, by bisection
            trial = self.attempt("cumulative", _whole_blocks(order[:middle], blocks))
            if trial is None:
                ceiling = middle
            elif trial.passed:
                passing = middle
            else:
                failing = middle
        while passing is not None and passing - failing > 1 and self.spent < self._max_trials:
            middle = (failing + passing) // 2
            trial = self.attempt("cumulative", _whole_blocks(order[:middle], blocks))
            if trial is not None and trial.passed:
                passing = middle
            else:
                failing = middle

    def best(self) -> Trial:
        passed = [t for t in self.trials if t.passed]
        if passed:
            return min(passed, key=lambda t: (-t.quantized, -t.cosine, len(t.float_nodes), -(t.samples_per_s or 0.0)))
        return min(self.trials, key=lambda t: _sortable(t.drop))


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


def first_samples(feeds: list[Batch], samples: int, layout: Layout = AXIS0) -> list[Batch]:
    """The leading calibration batches (rows on `layout`'s batch axes) holding at least `samples` samples
    (all of them if fewer)."""
    taken, count = [], 0
    for feed in feeds:
        if count >= samples:
            break
        taken.append(feed)
        count += layout.rows(feed)
    return taken
