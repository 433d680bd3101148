"""Validate candidates against the FP32 baseline: accuracy, fidelity and throughput gates, then selection.

Input problems (a metric that does not fit the outputs, a batch size a fixed-shape model cannot
take, a missing provider) are raised before anything slow runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

import numpy as np

from temper.artifacts import engines
from temper.artifacts.core import onnx_io
from temper.artifacts.core.errors import RecipeError
from temper.artifacts.core.host import HostProfile, profile, usable_cores
from temper.artifacts.core.layout import AXIS0, Layout
from temper.artifacts.engines.onnxruntime import SessionSettings
from temper.artifacts.engines.providers import PROVIDERS, Provider
from temper.calibration.sources import Dataset
from temper.validators import engine_census, report_model, scoring, tensorrt_census
from temper.validators.benches import Bench, bench_all
from temper.validators.census import Census, of_file
from temper.validators.composition import Composer
from temper.validators.engine_agreement import disagreements
from temper.validators.evaluate import Kept, predict
from temper.validators.fidelity import compare_outputs, fidelity_gates
from temper.validators.gates import Gate, Selection, Verdict, at_most, select
from temper.validators.gpu_precision import int8_over_fp16
from temper.validators.pairs import BASELINE, Pair, pairs, reference, split
from temper.validators.selection import why_baseline, why_selected
from temper.validators.session_search import Records
from temper.validators.spec import ValidateSpec
from temper.validators.speedup import Speedup, estimate
from temper.validators.throughput import Measurement, batch_of, session_for
from temper.validators.truth import truth_gates


class Searched(Protocol):
    """A searched candidate (pipeline.search.Search): the combinations built, and how many there were."""

    @property
    def trials(self) -> list[str]: ...

    @property
    def combinations(self) -> int: ...


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
    searches: Mapping[str, Searched] = field(default_factory=dict)  # searched candidate -> its trials
    precisions: dict[str, str] = field(default_factory=dict)  # candidate -> fp16, int8-static, ...
    preset: dict[str, str | None] | None = None  # what quantize's preset auto resolved to: target, preset, reason
    tunings: dict[str, dict[str, Any]] = field(default_factory=dict)  # candidate -> its quantize fallback record
    layout: Layout = AXIS0  # batch axes and constants every batch is formed with
    records: Records | None = None  # where session settings searches are kept between runs (the pipeline's cache)
    kept: Kept | None = None  # where models' outputs over the data are kept between runs (the pipeline's cache)
    serving_pad: dict[str, int | float] = field(default_factory=dict)  # publish.serving: how the batcher pads
    serving_batch: int = 16  # publish.serving.max_batch_size: the batches the composition gates form


@dataclass
class CandidateResult:
    verdict: Verdict  # named by the pair's key: the model's name on the reference engine, else model@engine
    pair: Pair
    metric: float | None = None
    drop: float | None = None
    fidelity: list[report_model.Comparison] = field(default_factory=list)
    throughput: list[tuple[Measurement, Speedup]] = field(default_factory=list)  # with its speedup interval
    tuning: dict[str, Any] | None = None  # the quantize fallback's record (tuning.json), when it ran
    census: Census | None = None  # what the built graph computes in (None: it did not build)
    engine_precision: str | None = None  # what the engine computes float ops in, read back (OpenVINO); None: graph
    engine_census: Census | None = None  # what ONNX Runtime's CPU provider runs of a quantized graph (engine_census)
    composition: report_model.BatchComposition | None = None  # its answers inside batches of other rows


@dataclass
class Validation:
    subject: Subject
    host: HostProfile  # where every figure was measured
    metric_name: str | None
    baseline_metric: float | None
    allowed_drop: float | None
    baseline_throughput: list[Measurement]  # the reference pair's: the baseline on the first engine
    candidates: list[CandidateResult]  # every other pair
    selected: str  # a pair's key, or "baseline" when none passed or none that passed beat the reference
    reason: str  # why that pair was selected
    session_searches: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # model -> one per provider
    selection: Selection = field(default_factory=lambda: Selection(None))  # with the pairs tied with the selected
    disagreements: list[report_model.EngineDisagreement] = field(default_factory=list)  # one file, two engines
    baseline_composition: report_model.BatchComposition | None = None

    @property
    def passed(self) -> bool:
        """A candidate was selected: it passed every gate and beat the baseline (gates.select)."""
        return self.selected != BASELINE


Progress = Callable[[str], None]


def engines_of(spec: ValidateSpec) -> list[str]:
    """The engines a recipe pairs its models with: validate.throughput.providers, else ONNX Runtime's CPU."""
    return list(spec.throughput.providers) if spec.throughput else ["cpu"]


def evaluated_on(engine: str) -> str:
    """Where a pair's accuracy and fidelity are measured: on its own row, so that what is gated is what the
    engine computes (a BF16 engine on its own outputs, a GPU's FP16 kernels on theirs)."""
    return engine


def validate(subject: Subject, progress: Progress = lambda _: None, log: Progress = lambda _: None) -> Validation:
    """Every pair's gates and the selection. `progress` hears what is being done now, `log` each piece of the
    timing that finished (a pair at a batch size), for a line of its own in a CI log."""
    spec = subject.spec
    host = profile()
    engines = engines_of(spec)
    ref = reference(engines)
    built = {name: path for name, path in subject.candidates.items() if isinstance(path, Path)}
    sample = {k: v[: max(spec.throughput.batch_sizes) if spec.throughput else 1]
              for k, v in subject.evaluation.features.items()}
    if spec.throughput:
        _precheck_throughput(subject, built, sample)

    progress("baseline › evaluate")
    base_out = predict(subject.baseline, subject.evaluation.features, subject.eval_batch_size, subject.layout,
                       evaluated_on(ref.engine), subject.kept)
    scorer = None
    if spec.accuracy:
        scorer = scoring.reference(spec, subject.baseline, base_out, subject.outputs, subject.evaluation,
                                   subject.calibration, subject.eval_batch_size, subject.base, subject.recipe_file,
                                   subject.layout, subject.kept)

    paths = {BASELINE: subject.baseline, **built}
    measured = {pair.key(ref.engine): (pair, paths[pair.model]) for pair in pairs(list(built), engines)}
    benches, searches = bench_all(spec.throughput, measured, ref.key(ref.engine), sample, progress, subject.layout,
                                  host, subject.records, log)
    outputs = {(BASELINE, evaluated_on(ref.engine)): base_out}
    progress("baseline › batch composition")
    composer = Composer(subject.evaluation.features, subject.layout, subject.serving_pad, subject.serving_batch, spec,
                        subject.baseline, evaluated_on(ref.engine))
    results = []
    for pair in pairs(list(subject.candidates), engines):
        key, path = pair.key(ref.engine), paths.get(pair.model)
        if pair == ref or (path is None and pair.engine != ref.engine):
            continue  # a model that did not build is reported once, on the reference engine
        result = CandidateResult(Verdict(key), pair)
        results.append(result)
        if path is None:
            why = subject.candidates[pair.model]
            result.verdict.gates.append(Gate("build", False, None, None, str(why), kind="build"))
            continue
        result.verdict.bytes = path.stat().st_size
        result.tuning = subject.tunings.get(pair.model)
        result.verdict.gates.append(Gate("build", True, None, None, "built", kind="build"))
        result.census = of_file(path)
        result.verdict.gates += truth_gates(result.census, subject.precisions.get(pair.model), result.tuning)
        where = (pair.model, evaluated_on(pair.engine))
        if where not in outputs:
            progress(f"{key} › evaluate")
            outputs[where] = predict(path, subject.evaluation.features, subject.eval_batch_size, subject.layout,
                                     where[1], subject.kept)
        out = outputs[where]
        if scorer is not None:
            result.metric, result.drop = scorer.score(out)
            result.verdict.gates.append(at_most("accuracy", "accuracy", result.drop, scorer.allowed,
                                                f"{scorer.metric.name} drop"))
        result.fidelity = compare_outputs(base_out, out, spec)  # whole outputs, then the recipe's slices
        result.verdict.gates += fidelity_gates(result.fidelity, spec)
        result.verdict.fidelity = min([c.cosine for c in result.fidelity]
                                      + [c.worst_row.cosine for c in result.fidelity if c.worst_row], default=None)
        result.composition, batched = composer.of(path, where[1])  # validators/composition.py
        result.verdict.gates += batched
        result.throughput = [_speed(bench, key, spec) for bench in benches]
        result.verdict.gates += [g for bench, (_, up) in zip(benches, result.throughput)
                                 if (g := _speed_gate(bench, up, pair.engine, spec)) is not None]
        result.verdict.speed, result.verdict.speedup = _rank_speed(result.throughput, spec)
        result.engine_precision = _engine_precision(result, pair, path)
        if pair.engine == "cpu" and result.census.quantized:
            result.engine_census = engine_census.of_session(path, _ort_settings(result))
        if pair.engine == "tensorrt":  # the engine TensorRT built, read back (validators/tensorrt_census.py)
            result.verdict.gates += tensorrt_census.gates(path, subject.precisions.get(pair.model, "fp32"))
    if spec.throughput:  # on a GPU row, INT8 must also beat FP16
        over = int8_over_fp16([(r.verdict.name, r.pair) for r in results], subject.precisions, benches,
                              spec.throughput.confidence)
        for result in results:
            result.verdict.gates += [over[result.verdict.name]] if result.verdict.name in over else []
    base_bytes = subject.baseline.stat().st_size
    verdicts = [r.verdict for r in results]
    ranking = next((b for b in benches if spec.throughput and b.batch_size == max(spec.throughput.batch_sizes)), None)

    def versus(a: str, b: str) -> Speedup | None:  # a's speed over b's, in the same rounds (the gates' statistics)
        return None if ranking is None or spec.throughput is None else estimate(ranking.ratios(a, over=b),
                                                                                spec.throughput.confidence)

    selection = select(verdicts, subject.rule, base_bytes, versus)
    reason = (why_selected(selection, verdicts, subject.rule, spec, base_bytes) if selection.name else
              why_baseline([(r.verdict, r.pair.model) for r in results], host, subject.precisions, subject.rule,
                           spec, base_bytes))
    return Validation(subject, host, scorer.metric.name if scorer else None, scorer.value if scorer else None,
                      scorer.allowed if scorer else None,
                      [bench.figure(ref.key(ref.engine)) for bench in benches], results, selection.name or BASELINE,
                      reason, searches, selection, disagreements(outputs, spec),
                      composer.of(subject.baseline, evaluated_on(ref.engine))[0])


def _ort_settings(result: CandidateResult) -> SessionSettings:
    """The ONNX Runtime settings a CPU pair was measured with (its graph optimization level decides what
    the engine fuses into INT8 kernels); unmeasured, the default a bundle serves with."""
    for measurement, _ in result.throughput:
        if measurement.session:
            return SessionSettings.model_validate(measurement.session)
    return SessionSettings(intra_op_threads=usable_cores())


def _engine_precision(result: CandidateResult, pair: Pair, path: Path) -> str | None:
    """The precision a pair's engine computes in as the live session reported it, for a runtime that has one
    of its own (OpenVINO's compiled model): the speed figures' read-back settings, else a session's
    (session_for refuses one that reports another than asked). None: the graph's precision is what runs."""
    engine = engines.of(pair.engine)
    for measurement, _ in result.throughput:
        if measurement.session:
            return engine.settings.model_validate(measurement.session).precision
    if PROVIDERS[cast(Provider, pair.engine)].precision is None:
        return None
    return engine.settings_of(session_for(path, pair.engine)).precision


def _precheck_throughput(subject: Subject, built: dict[str, Path], sample: dict[str, np.ndarray]) -> None:
    spec = subject.spec.throughput
    assert spec is not None  # called only when the recipe measures throughput
    for provider in spec.providers:
        session_for(subject.baseline, provider)  # EnvironmentProblem (exit 3) when it is not really there
    for name, path in {"baseline": subject.baseline, **built}.items():
        structure = onnx_io.load_structure(path)
        for index, size in enumerate(spec.batch_sizes):
            try:
                batch_of(structure, sample, size, subject.layout)
            except ValueError as exc:
                raise RecipeError(subject.recipe_file, f"validate.throughput.batch_sizes[{index}]",
                                  f"{name}: {exc}") from None


def _speed(bench: Bench, name: str, spec: ValidateSpec) -> tuple[Measurement, Speedup]:
    assert spec.throughput is not None
    return bench.figure(name), estimate(bench.ratios(name), spec.throughput.confidence)


def _speed_gate(bench: Bench, up: Speedup, engine: str, spec: ValidateSpec) -> Gate | None:
    """The min_speedup gate of a pair on `engine` at one batch size, over the reference (the baseline on
    the first engine), decided on the interval; None where it does not apply."""
    throughput = spec.throughput
    if throughput is None or throughput.min_speedup is None or bench.batch_size not in throughput.gated_sizes:
        return None
    minimum, where = throughput.min_speedup, f"at batch {bench.batch_size} on {engine}"
    if engine != throughput.providers[0]:
        where += f" over the baseline on {throughput.providers[0]}"
    name, interval = f"throughput.{engine}.b{bench.batch_size}", (
        (up.low, up.high) if up.low is not None and up.high is not None else None)
    level = f"{throughput.confidence:.0%}"
    decision = up.decide(minimum)

    def gate(passed: bool, detail: str, verdict: str) -> Gate:
        return Gate(name, passed, up.ratio, minimum, detail, verdict, interval, kind="throughput",
                    provider=engine, batch_size=bench.batch_size)

    if decision == "pass":
        return gate(True, f"speedup {where} {up.shown()} ({level}, {up.rounds} rounds): all of it >= {minimum:g}",
                    "pass")
    if decision == "fail":
        return gate(False, f"speedup {where} {up.shown()} ({level}, {up.rounds} rounds): all of it < {minimum:g}",
                    "fail")
    counted = throughput.inconclusive == "pass"
    return gate(counted, f"inconclusive: noise; speedup {where} {up.shown()} ({level}, {up.rounds} rounds, "
                         f"{throughput.budget_s:g} s budget) straddles {minimum:g}; counted as "
                         f"{'a pass' if counted else 'a failure'} (validate.throughput.inconclusive)", "inconclusive")


def _rank_speed(mine: list[tuple[Measurement, Speedup]], spec: ValidateSpec) -> tuple[float | None, Speedup | None]:
    """The ranking figure, a pair's samples/s at the largest batch size on its engine, and the speedup over
    the reference there (the interval selection asks to lie above 1.0)."""
    if not mine or spec.throughput is None:
        return None, None
    size = max(spec.throughput.batch_sizes)
    return next((m.samples_per_s, up) for m, up in mine if m.batch_size == size)


def build_report(validation: Validation) -> report_model.Report:
    """The report.json contract (validators/report_model.py; written with report_model.dumps)."""
    subject = validation.subject
    throughput = subject.spec.throughput
    engine = engines_of(subject.spec)[0]
    chosen = split(validation.selected, engine)
    return report_model.Report(
        schema_version=report_model.SCHEMA_VERSION,
        recipe=subject.recipe_name,
        host=validation.host,
        target=None if subject.preset is None else report_model.Target.model_validate(subject.preset),
        metric=validation.metric_name,
        baseline=report_model.Baseline(metric=validation.baseline_metric, engine=engine,
                                       throughput=[_measurement(m) for m in validation.baseline_throughput],
                                       batch_composition=validation.baseline_composition),
        allowed_drop=validation.allowed_drop,
        speed_policy=None if throughput is None else report_model.SpeedPolicy(
            min_speedup=throughput.min_speedup, gated_batch_sizes=throughput.gated_sizes,
            confidence=throughput.confidence, max_duration_s=throughput.budget_s,
            inconclusive=throughput.inconclusive),
        candidates={c.verdict.name: _candidate(c, subject.precisions.get(c.pair.model))
                    for c in validation.candidates},
        searches={name: report_model.Search(trials=s.trials, combinations=s.combinations)
                  for name, s in subject.searches.items()},
        session_searches={name: [report_model.SessionSearch.model_validate(r) for r in records]
                          for name, records in validation.session_searches.items()},
        select=subject.rule,
        selected=chosen.model,
        selected_engine=chosen.engine,
        selected_pair=validation.selected,
        selection_reason=validation.reason,
        ties=[report_model.TiedPair(pair=t.name, speedup=None if t.speedup is None else t.speedup.ratio,
                                    speedup_interval=_interval(t.speedup), fidelity=t.fidelity)
              for t in validation.selection.ties],
        engine_disagreements=validation.disagreements,
        passed=validation.passed,
    )


def _interval(up: Speedup | None) -> tuple[float, float] | None:
    return None if up is None or up.low is None or up.high is None else (up.low, up.high)


def _measurement(m: Measurement) -> report_model.Measurement:
    return report_model.Measurement.model_validate(m, from_attributes=True)


def _candidate(c: CandidateResult, precision: str | None) -> report_model.Candidate:
    return report_model.Candidate(
        model=c.pair.model,
        engine=c.pair.engine,
        engine_precision=c.engine_precision,
        passed=c.verdict.passed,
        precision=None if c.census is None else c.census.precision(),
        intended_precision=precision,
        census=None if c.census is None else report_model.Census.model_validate(c.census.as_dict()),
        engine_census=(None if c.engine_census is None
                       else report_model.Census.model_validate(c.engine_census.as_dict())),
        bytes=c.verdict.bytes,
        metric=c.metric,
        drop=c.drop,
        gates=[report_model.Gate.model_validate(g, from_attributes=True) for g in c.verdict.gates],
        fidelity=c.fidelity,
        throughput=[report_model.CandidateMeasurement.model_validate(
            {**m.as_dict(), "speedup": up.ratio,
             "speedup_interval": None if up.low is None or up.high is None else (up.low, up.high)})
            for m, up in c.throughput],
        tuning=None if c.tuning is None else report_model.Tuning.model_validate(c.tuning),
        batch_composition=c.composition,
    )
