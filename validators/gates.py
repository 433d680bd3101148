"""Gate verdicts and the selection rule: pure functions of measured numbers, no models or I/O.

The FP32 baseline always takes part in selection: a candidate that passed every gate is selected
over it only with evidence that it is better by the rule's own measure. For `fastest-passing`
that is a speedup interval (at the ranking batch size) lying wholly above 1.0, since an interval
straddling 1.0 is no evidence of being faster; for `smallest-passing`, a smaller file.
"""

from __future__ import annotations

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


def select(verdicts: list[Verdict], rule: str, baseline_bytes: int | None) -> str | None:
    """The candidate that passed every gate and beats the baseline (beats_baseline), best by `rule`:
    `fastest-passing` most samples/s, ties to the smaller file; `smallest-passing` the smaller file,
    ties to the faster. None: the baseline is the selection (the caller says why)."""
    eligible = [v for v in verdicts if v.passed and beats_baseline(v, rule, baseline_bytes)]
    if not eligible:
        return None
    if rule == "fastest-passing":
        best = min(eligible, key=lambda v: (-(v.speed or 0.0), v.bytes or 0))
    else:
        best = min(eligible, key=lambda v: (v.bytes or 0, -(v.speed or 0.0)))
    return best.name
