"""Validate candidates against the FP32 baseline: every (model, engine) pair through the gates of
validators/pair_gates.py, INT8 against FP16 on GPU rows, then selection with its reason.

Input problems (a metric that does not fit the outputs, a batch size a fixed-shape model cannot
take, a missing provider) are raised before anything slow runs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from temper.artifacts import engines
from temper.artifacts.core import onnx_io
from temper.artifacts.core.errors import RecipeError
from temper.artifacts.core.host import profile, usable_cores
from temper.artifacts.engines.onnxruntime import SessionSettings
from temper.artifacts.engines.providers import PROVIDERS, Provider
from temper.validators import engine_census, scoring
from temper.validators.benches import bench_all
from temper.validators.composition import Composer
from temper.validators.engine_agreement import disagreements
from temper.validators.evaluate import predict
from temper.validators.gates import Gate, Verdict, select
from temper.validators.gpu_precision import int8_over_fp16
from temper.validators.pair_gates import PAIR_GATES, Judged, Outputs
from temper.validators.pairs import BASELINE, Pair, pairs, reference
from temper.validators.report_build import build_report
from temper.validators.selection import why_baseline, why_selected
from temper.validators.speedup import Speedup, estimate
from temper.validators.subject import CandidateResult, Searched, Subject, Validation, providers_of
from temper.validators.throughput import batch_of, session_for

__all__ = ["CandidateResult", "Searched", "Subject", "Validation", "build_report", "providers_of", "validate"]

Progress = Callable[[str], None]


def evaluated_on(provider: Provider) -> Provider:
    """Where a pair's accuracy and fidelity are measured: on its own row, so that what is gated is what the
    engine computes (a BF16 engine on its own outputs, a GPU's FP16 kernels on theirs)."""
    return provider


def validate(subject: Subject, progress: Progress = lambda _: None, log: Progress = lambda _: None) -> Validation:
    """Every pair's gates and the selection. `progress` hears what is being done now, `log` each piece of the
    timing that finished (a pair at a batch size), for a line of its own in a CI log."""
    spec = subject.spec
    host = profile()
    providers = providers_of(spec)
    ref = reference(providers)
    built = {name: path for name, path in subject.candidates.items() if isinstance(path, Path)}
    sample = {k: v[: max(spec.throughput.batch_sizes) if spec.throughput else 1]
              for k, v in subject.evaluation.features.items()}
    if spec.throughput:
        _precheck_throughput(subject, built, sample)

    progress("baseline › evaluate")
    base_out = predict(subject.baseline, subject.evaluation.features, subject.eval_batch_size, subject.layout,
                       evaluated_on(ref.provider), subject.kept)
    scorer = None
    if spec.accuracy:
        scorer = scoring.reference(spec, subject.baseline, base_out, subject.outputs, subject.evaluation,
                                   subject.calibration, subject.eval_batch_size, subject.base, subject.recipe_file,
                                   subject.layout, subject.kept)

    paths = {BASELINE: subject.baseline, **built}
    measured = {pair.key(ref.provider): (pair, paths[pair.model]) for pair in pairs(list(built), providers)}
    benches, searches = bench_all(spec.throughput, measured, ref.key(ref.provider), sample, progress, subject.layout,
                                  host, subject.records, log)
    outputs: dict[tuple[str, str], Outputs] = {(BASELINE, evaluated_on(ref.provider)): base_out}
    progress("baseline › batch composition")
    composer = Composer(subject.evaluation.features, subject.layout, subject.serving_pad, subject.serving_batch, spec,
                        subject.baseline, evaluated_on(ref.provider))
    results = []
    for pair in pairs(list(subject.candidates), providers):
        key, path = pair.key(ref.provider), paths.get(pair.model)
        if pair == ref or (path is None and pair.provider != ref.provider):
            continue  # a model that did not build is reported once, on the reference engine
        result = CandidateResult(Verdict(key), pair, tuning=subject.tunings.get(pair.model))
        results.append(result)
        if path is None:
            why = subject.candidates[pair.model]
            result.verdict.gates.append(Gate("build", False, None, None, str(why), kind="build"))
            continue
        result.verdict.bytes = path.stat().st_size
        result.verdict.gates.append(Gate("build", True, None, None, "built", kind="build"))
        where = (pair.model, evaluated_on(pair.provider))
        if where not in outputs:
            progress(f"{key} › evaluate")
            outputs[where] = predict(path, subject.evaluation.features, subject.eval_batch_size, subject.layout,
                                     where[1], subject.kept)
        judged = Judged(subject, result, path, where[1], outputs[where], base_out, scorer, benches, composer)
        for gate in PAIR_GATES:
            result.verdict.gates += gate(judged)
        result.engine_precision = _engine_precision(result, pair, path)
        if pair.provider == "cpu" and result.census is not None and result.census.quantized:
            result.engine_census = engine_census.of_session(path, _ort_settings(result))
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
                      [bench.figure(ref.key(ref.provider)) for bench in benches], results, selection.name or BASELINE,
                      reason, searches, selection, disagreements(outputs, spec),
                      composer.of(subject.baseline, evaluated_on(ref.provider))[0])


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
    engine = engines.of(pair.provider)
    for measurement, _ in result.throughput:
        if measurement.session:
            return engine.settings.model_validate(measurement.session).precision
    if PROVIDERS[pair.provider].precision is None:
        return None
    return engine.settings_of(session_for(path, pair.provider)).precision


def _precheck_throughput(subject: Subject, built: dict[str, Path], sample: dict[str, np.ndarray]) -> None:
    spec = subject.spec.throughput
    assert spec is not None  # called only when the recipe measures throughput
    for provider in () if subject.providers_active else spec.providers:  # once: the pre-flight's, else here
        session_for(subject.baseline, provider)  # EnvironmentProblem (exit 3) when it is not really there
    for name, path in {"baseline": subject.baseline, **built}.items():
        structure = onnx_io.load_structure(path)
        for index, size in enumerate(spec.batch_sizes):
            try:
                batch_of(structure, sample, size, subject.layout)
            except ValueError as exc:
                raise RecipeError(subject.recipe_file, f"validate.throughput.batch_sizes[{index}]",
                                  f"{name}: {exc}") from None
