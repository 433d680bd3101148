"""The gates every (model, engine) pair goes through, as one list of functions with one signature.

Each gate takes the Judged pair (its model, its outputs, the baseline's, the speed benches) and returns its
Gate rows, recording what it measured on the pair's CandidateResult for report.json. Adding a gate is its
function here, its entry in PAIR_GATES, its spec in validators/spec.py and its row in validators/report.py.
Gates across pairs (INT8 against FP16 on a GPU row: gpu_precision.py) run in validation.py after these."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from temper.artifacts.engines.providers import Provider
from temper.validators import tensorrt_census
from temper.validators.census import of_file
from temper.validators.composition import Composer
from temper.validators.fidelity import compare_outputs, fidelity_gates
from temper.validators.gates import Gate, at_most
from temper.validators.rounds import Bench
from temper.validators.scoring import Reference
from temper.validators.spec import ValidateSpec
from temper.validators.speedup import Speedup, estimate
from temper.validators.subject import CandidateResult, Subject
from temper.validators.throughput import Measurement
from temper.validators.truth import truth_gates

Outputs = dict[str, np.ndarray]


@dataclass(frozen=True)
class Judged:
    """One built pair and what its gates compare it with."""

    subject: Subject
    result: CandidateResult  # the gates record their measurements here
    path: Path  # the pair's model file
    provider: Provider  # where its outputs were computed (validation.evaluated_on)
    outputs: Outputs  # the pair's outputs over the evaluation set
    baseline: Outputs  # the baseline's, on the reference engine
    scorer: Reference | None  # the accuracy metric against the baseline (None: the recipe has no accuracy gate)
    benches: list[Bench]  # the speed rounds, one per batch size
    composer: Composer  # the batch-composition measurements

    @property
    def spec(self) -> ValidateSpec:
        return self.subject.spec


def truth(judged: Judged) -> list[Gate]:
    """The graph computes in the precision its candidate names (validators/truth.py)."""
    result = judged.result
    result.census = of_file(judged.path)
    return truth_gates(result.census, judged.subject.precisions.get(result.pair.model), result.tuning)


def accuracy(judged: Judged) -> list[Gate]:
    """The recipe's metric drops at most its budget from the baseline's."""
    if judged.scorer is None:
        return []
    result, scorer = judged.result, judged.scorer
    result.metric, result.drop = scorer.score(judged.outputs)
    return [at_most("accuracy", "accuracy", result.drop, scorer.allowed, f"{scorer.metric.name} drop")]


def fidelity(judged: Judged) -> list[Gate]:
    """Whole outputs, their worst rows, then the recipe's slices, against the baseline (validators/fidelity.py)."""
    result = judged.result
    result.fidelity = compare_outputs(judged.baseline, judged.outputs, judged.spec)
    result.verdict.fidelity = min([c.cosine for c in result.fidelity]
                                  + [c.worst_row.cosine for c in result.fidelity if c.worst_row], default=None)
    return fidelity_gates(result.fidelity, judged.spec)


def composition(judged: Judged) -> list[Gate]:
    """Each row's answer inside batches of other rows, as the server batches (validators/composition.py)."""
    judged.result.composition, gates = judged.composer.of(judged.path, judged.provider)
    return gates


def speed(judged: Judged) -> list[Gate]:
    """min_speedup over the reference at each gated batch size, decided on the paired interval."""
    result, spec = judged.result, judged.spec
    result.throughput = [_speed(bench, result.verdict.name, spec) for bench in judged.benches]
    gates = [g for bench, (_, up) in zip(judged.benches, result.throughput)
             if (g := speed_gate(bench, up, result.pair.provider, spec)) is not None]
    result.verdict.speed, result.verdict.speedup = _rank_speed(result.throughput, spec)
    return gates


def tensorrt(judged: Judged) -> list[Gate]:
    """The engine TensorRT built, read back: an FP16 or INT8 candidate must run in its precision."""
    if judged.result.pair.provider != "tensorrt":
        return []
    return tensorrt_census.gates(judged.path, judged.subject.precisions.get(judged.result.pair.model, "fp32"))


PAIR_GATES: list[Callable[[Judged], list[Gate]]] = [truth, accuracy, fidelity, composition, speed, tensorrt]


def _speed(bench: Bench, name: str, spec: ValidateSpec) -> tuple[Measurement, Speedup]:
    assert spec.throughput is not None
    return bench.figure(name), estimate(bench.ratios(name), spec.throughput.confidence)


def speed_gate(bench: Bench, up: Speedup, provider: Provider, spec: ValidateSpec) -> Gate | None:
    """The min_speedup gate of a pair on `provider` at one batch size, over the reference (the baseline on
    the first provider), decided on the interval; None where it does not apply."""
    throughput = spec.throughput
    if throughput is None or throughput.min_speedup is None or bench.batch_size not in throughput.gated_sizes:
        return None
    minimum, where = throughput.min_speedup, f"at batch {bench.batch_size} on {provider}"
    if provider != throughput.providers[0]:
        where += f" over the baseline on {throughput.providers[0]}"
    name, interval = f"throughput.{provider}.b{bench.batch_size}", (
        (up.low, up.high) if up.low is not None and up.high is not None else None)
    level = f"{throughput.confidence:.0%}"
    decision = up.decide(minimum)

    def gate(passed: bool, detail: str, verdict: str) -> Gate:
        return Gate(name, passed, up.ratio, minimum, detail, verdict, interval, kind="throughput",
                    provider=provider, batch_size=bench.batch_size)

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
