"""Gate verdicts and the selection rule: pure functions of measured numbers, no models or I/O.

The FP32 baseline always takes part in selection: a candidate that passed every gate is selected
over it only with evidence that it is better by the rule's own measure. For `fastest-passing`
that is a speedup interval (at the ranking batch size) lying wholly above 1.0, since an interval
straddling 1.0 is no evidence of being faster; for `smallest-passing`, a smaller file.

Among those, candidates are ranked on the same paired intervals: the leader is the one with the largest
speedup over the reference (the geometric mean of its paired per-round ratios), and every other whose paired
interval against the leader (their own per-round ratios, timed in the same rounds) holds 1.0 is tied with it.
A tie goes to the more faithful pair (the lowest cosine of its outputs, rows and slices to the baseline's),
then to the smaller file. `smallest-passing` ranks on the file size first and breaks equal sizes (one
file on two engines) the same way. The selection says which pairs tied.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from temper.validators.speedup import Speedup

GateKind = Literal["build", "accuracy", "fidelity", "throughput", "precision", "fallback"]


@dataclass(frozen=True)
class Gate:
    """One check of one candidate: what was measured, against what budget, and the verdict. Readers
    tell gates apart by `kind` (and a speed gate's `provider` and `batch_size`), never by parsing `name`."""

    name: str  # "build", "accuracy", "fidelity.<output>.cosine", "throughput.cpu.b32", ...
    passed: bool
    measured: float | None
    budget: float | None
    detail: str
    verdict: str = ""  # "pass", "fail" or "inconclusive" (a speed gate noise kept from deciding)
    interval: tuple[float, float] | None = None  # a speed gate's confidence interval
    kind: GateKind = field(kw_only=True)
    provider: str | None = field(default=None, kw_only=True)  # a speed gate's
    batch_size: int | None = field(default=None, kw_only=True)  # a speed gate's

    def __post_init__(self) -> None:
        if not self.verdict:
            object.__setattr__(self, "verdict", "pass" if self.passed else "fail")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Verdict:
    """Everything decided about one candidate."""

    name: str
    gates: list[Gate] = field(default_factory=list)
    bytes: int | None = None
    speed: float | None = None  # samples/s used to rank (largest batch size, first provider)
    speedup: Speedup | None = None  # over the baseline at that batch size and provider, with its interval
    fidelity: float | None = None  # its least cosine to the baseline: outputs, worst rows, slices (a tie-break)

    @property
    def passed(self) -> bool:
        return bool(self.gates) and all(g.passed for g in self.gates)


def at_least(kind: GateKind, name: str, measured: float, minimum: float, what: str) -> Gate:
    ok = bool(measured >= minimum)
    return Gate(name, ok, measured, minimum, f"{what} {measured:.4g} {'>=' if ok else '<'} {minimum:.4g}", kind=kind)


def at_most(kind: GateKind, name: str, measured: float, maximum: float, what: str) -> Gate:
    ok = bool(measured <= maximum)
    return Gate(name, ok, measured, maximum, f"{what} {measured:.4g} {'<=' if ok else '>'} {maximum:.4g}", kind=kind)


def beats_baseline(verdict: Verdict, rule: str, baseline_bytes: int | None) -> bool:
    """Whether `verdict` is evidently better than the baseline by `rule`'s measure: for `fastest-passing`
    the low end of its speedup interval is above 1.0 (unmeasured or inconclusive is not evidence);
    for `smallest-passing` its file is smaller than the baseline's."""
    if rule == "fastest-passing":
        return verdict.speedup is not None and verdict.speedup.low is not None and verdict.speedup.low > 1.0
    return verdict.bytes is not None and baseline_bytes is not None and verdict.bytes < baseline_bytes


Versus = Callable[[str, str], Speedup | None]  # (a, b) -> a's speed over b's, paired, at the ranking batch size


@dataclass(frozen=True)
class Tie:
    """A pair that passed every gate, beat the baseline and could not be told from the selected one."""

    name: str
    speedup: Speedup | None  # the selected pair's speed over this one's, paired (None: speed not measured)
    fidelity: float | None


@dataclass(frozen=True)
class Selection:
    """The selected pair (None: the baseline), and those tied with it that it won over on fidelity or size."""

    name: str | None
    ties: list[Tie] = field(default_factory=list)
    leader: str | None = None  # the fastest by its speedup, when another pair won the tie


def _never(_a: str, _b: str) -> Speedup | None:
    return None


def select(verdicts: list[Verdict], rule: str, baseline_bytes: int | None, versus: Versus = _never) -> Selection:
    """The candidate that passed every gate and beats the baseline (beats_baseline), best by `rule` as the
    module says: `versus(a, b)` is a's paired speed over b's. Selection(None): the baseline is the selection
    (the caller says why)."""
    eligible = [v for v in verdicts if v.passed and beats_baseline(v, rule, baseline_bytes)]
    if not eligible:
        return Selection(None)
    if rule == "smallest-passing":
        smallest = min(v.bytes or 0 for v in eligible)
        eligible = [v for v in eligible if (v.bytes or 0) == smallest]
    leader = max(eligible, key=lambda v: v.speedup.ratio if v.speedup else 0.0)  # first of equals: recipe order
    tied = [leader] + [v for v in eligible if v is not leader and _tied(versus(leader.name, v.name))]
    best = min(tied, key=lambda v: (-(v.fidelity if v.fidelity is not None else -2.0), v.bytes or 0))
    ties = [Tie(v.name, versus(best.name, v.name), v.fidelity) for v in tied if v is not best]
    return Selection(best.name, ties, leader.name if best is not leader else None)


def _tied(up: Speedup | None) -> bool:
    """Whether a paired interval is no evidence either way: it holds 1.0, or there is none."""
    return up is None or up.low is None or up.high is None or up.low <= 1.0 <= up.high
