"""Validate candidates against the FP32 baseline: accuracy, fidelity and throughput gates, then selection.

Input problems (a metric that does not fit the outputs, a batch size a fixed-shape model cannot
take, a missing provider) are raised before anything slow runs.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from calibration.sources import Dataset
from pipeline import onnx_io
from pipeline.cache import TUNING_FILE
from pipeline.errors import RecipeError
from pipeline.recipe import ValidateSpec
from pipeline.search import Search
from validators import scoring
from validators.evaluate import predict
from validators.fidelity import OutputComparison, compare, fidelity_gates
from validators.gates import Gate, Verdict, at_least, at_most, select
from validators.throughput import Measurement, batch_of, measure, session_for


@dataclass(frozen=True)
class Subject:
    """What is validated: the recipe's gates, its data, and the models the run produced."""

    recipe_name: str
    recipe_file: str
    base: Path
    spec: ValidateSpec
    rule: str
    evaluation: Dataset
    eval_batch_size: int
    calibration: Dataset | None
    outputs: list[str]
    baseline: Path
    candidates: dict[str, Path | str]  # the built model, or the reason its build failed
    searches: dict[str, Search] = field(default_factory=dict)  # searched candidate -> its trials


@dataclass
class CandidateResult:
    verdict: Verdict
    metric: float | None = None
    drop: float | None = None
    fidelity: list[OutputComparison] = field(default_factory=list)
    throughput: list[Measurement] = field(default_factory=list)
    tuning: dict[str, Any] | None = None  # the quantize fallback's record (tuning.json), when it ran


@dataclass
class Validation:
    subject: Subject
    metric_name: str | None
    baseline_metric: float | None
    allowed_drop: float | None
    baseline_throughput: list[Measurement]
    candidates: list[CandidateResult]
    selected: str | None

    @property
    def passed(self) -> bool:
        return self.selected is not None


Progress = Callable[[str], None]


def validate(subject: Subject, progress: Progress = lambda _: None) -> Validation:
    spec = subject.spec
    built = {name: path for name, path in subject.candidates.items() if isinstance(path, Path)}
    sample = {k: v[: max(spec.throughput.batch_sizes) if spec.throughput else 1] for k, v in subject.evaluation.features.items()}
    if spec.throughput:
        _precheck_throughput(subject, built, sample)

    progress("baseline › evaluate")
    base_out = predict(subject.baseline, subject.evaluation.features, subject.eval_batch_size)
    ref = None
    if spec.accuracy:
        ref = scoring.reference(spec, subject.baseline, base_out, subject.outputs, subject.evaluation,
                                subject.calibration, subject.eval_batch_size, subject.base, subject.recipe_file)

    speeds = _bench_all(subject, {"baseline": subject.baseline, **built}, sample, progress)
    base_speed = speeds["baseline"]
    results = []
    for name, path in subject.candidates.items():
        result = CandidateResult(Verdict(name))
        results.append(result)
        if not isinstance(path, Path):
            result.verdict.gates.append(Gate("build", False, None, None, path))
            continue
        result.verdict.bytes = path.stat().st_size
        if (path.parent / TUNING_FILE).is_file():
            result.tuning = json.loads((path.parent / TUNING_FILE).read_text())
        result.verdict.gates.append(Gate("build", True, None, None, "built"))
        progress(f"{name} › evaluate")
        out = predict(path, subject.evaluation.features, subject.eval_batch_size)
        if ref is not None:
            result.metric, result.drop = ref.score(out)
            result.verdict.gates.append(at_most("accuracy", result.drop, ref.allowed, f"{ref.metric.name} drop"))
        result.fidelity = [compare(o, base_out[o], out[o], atol=0.0, rtol=0.0) for o in base_out]
        result.verdict.gates += fidelity_gates(result.fidelity, spec)
        result.throughput = speeds[name]
        result.verdict.gates += _speed_gates(result.throughput, base_speed, spec)
        result.verdict.speed = _rank_speed(result.throughput, spec)
    selected = select([r.verdict for r in results], subject.rule)
    return Validation(subject, ref.metric.name if ref else None, ref.value if ref else None,
                      ref.allowed if ref else None, base_speed, results, selected)


def _precheck_throughput(subject: Subject, built: dict[str, Path], sample: dict[str, np.ndarray]) -> None:
    spec = subject.spec.throughput
    for provider in spec.providers:
        session_for(subject.baseline, provider)  # EnvironmentProblem (exit 3) when it is not really there
    for name, path in {"baseline": subject.baseline, **built}.items():
        structure = onnx_io.load_structure(path)
        for index, size in enumerate(spec.batch_sizes):
            try:
                batch_of(structure, sample, size)
            except ValueError as exc:
                raise RecipeError(subject.recipe_file, f"validate.throughput.batch_sizes[{index}]", f"{name}: {exc}") from None


ROUNDS = 5  # each figure is the median of this many interleaved slices
SLICE_WARMUP_S = 0.05  # later slices reuse a warm session: a few calls re-fill the caches


def _bench_all(subject: Subject, models: dict[str, Path], sample: dict[str, np.ndarray],
               progress: Progress) -> dict[str, list[Measurement]]:
    """Throughput of every model, side by side: for each provider and batch size the models take turns
    in ROUNDS slices of duration_s / ROUNDS on sessions created once, and each keeps its median slice.
    A burst of noise on a shared machine then hits every model alike instead of skewing whichever
    model was measuring at the time."""
    spec = subject.spec.throughput
    found: dict[str, list[Measurement]] = {name: [] for name in models}
    if spec is None:
        return found
    for provider in spec.providers:
        sessions = {name: session_for(path, provider) for name, path in models.items()}
        for size in spec.batch_sizes:
            progress(f"throughput › {provider} batch {size}: {', '.join(models)}")
            slices: dict[str, list[Measurement]] = {name: [] for name in models}
            for round_ in range(ROUNDS):
                for name, path in models.items():
                    warmup = spec.warmup_s if round_ == 0 else min(spec.warmup_s, SLICE_WARMUP_S)
                    slices[name].append(measure(path, sample, size, provider, spec.duration_s / ROUNDS, warmup,
                                                session=sessions[name]))
            for name, taken in slices.items():
                found[name].append(sorted(taken, key=lambda m: m.samples_per_s)[ROUNDS // 2])
    return found


def _speed_gates(mine: list[Measurement], base: list[Measurement], spec: ValidateSpec) -> list[Gate]:
    if spec.throughput is None or spec.throughput.min_speedup is None:
        return []
    reference = {(m.provider, m.batch_size): m.samples_per_s for m in base}
    gated = spec.throughput.speedup_at or spec.throughput.batch_sizes
    return [
        at_least(f"throughput.{m.provider}.b{m.batch_size}", m.samples_per_s / reference[(m.provider, m.batch_size)],
                 spec.throughput.min_speedup, f"speedup over baseline at batch {m.batch_size} on {m.provider}")
        for m in mine if m.batch_size in gated
    ]


def _rank_speed(mine: list[Measurement], spec: ValidateSpec) -> float | None:
    """The ranking figure: samples/s at the largest batch size on the first provider."""
    if not mine or spec.throughput is None:
        return None
    key = (spec.throughput.providers[0], max(spec.throughput.batch_sizes))
    return next(m.samples_per_s for m in mine if (m.provider, m.batch_size) == key)


def speedups(validation: Validation) -> dict[str, dict[str, float]]:
    """candidate -> "provider/bN" -> speedup over the baseline, for reports and plots."""
    reference = {(m.provider, m.batch_size): m.samples_per_s for m in validation.baseline_throughput}
    return {c.verdict.name: {f"{m.provider}/b{m.batch_size}": m.samples_per_s / reference[(m.provider, m.batch_size)]
                             for m in c.throughput} for c in validation.candidates}


def as_report(validation: Validation) -> dict[str, Any]:
    """The report.json contract (schema: validators/report.schema.json)."""
    subject = validation.subject
    ups = speedups(validation)
    return {
        "schema_version": 1,
        "recipe": subject.recipe_name,
        "metric": validation.metric_name,
        "baseline": {"metric": validation.baseline_metric,
                     "throughput": [m.as_dict() for m in validation.baseline_throughput]},
        "allowed_drop": validation.allowed_drop,
        "candidates": {
            c.verdict.name: {
                "passed": c.verdict.passed,
                "bytes": c.verdict.bytes,
                "metric": c.metric,
                "drop": c.drop,
                "gates": [g.as_dict() for g in c.verdict.gates],
                "fidelity": [f.as_dict() for f in c.fidelity],
                "throughput": [{**m.as_dict(), "speedup": ups[c.verdict.name][f"{m.provider}/b{m.batch_size}"]}
                               for m in c.throughput],
                "tuning": c.tuning,
            }
            for c in validation.candidates
        },
        "searches": {name: {"trials": s.trials, "combinations": s.combinations}
                     for name, s in subject.searches.items()},
        "select": subject.rule,
        "selected": validation.selected,
        "passed": validation.passed,
    }
