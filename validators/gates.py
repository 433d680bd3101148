"""Gate verdicts and the selection rule: pure functions of measured numbers, no models or I/O."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Gate:
    """One check of one candidate: what was measured, against what budget, and the verdict."""

    name: str  # "build", "accuracy", "fidelity.<output>.cosine", "throughput.cpu.b32", ...
    passed: bool
    measured: float | None
    budget: float | None
    detail: str
    verdict: str = ""  # "pass", "fail" or "inconclusive" (a speed gate noise kept from deciding)
    interval: tuple[float, float] | None = None  # a speed gate's confidence interval

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

    @property
    def passed(self) -> bool:
        return bool(self.gates) and all(g.passed for g in self.gates)


def at_least(name: str, measured: float, minimum: float, what: str) -> Gate:
    ok = bool(measured >= minimum)
    return Gate(name, ok, measured, minimum, f"{what} {measured:.4g} {'>=' if ok else '<'} {minimum:.4g}")


def at_most(name: str, measured: float, maximum: float, what: str) -> Gate:
    ok = bool(measured <= maximum)
    return Gate(name, ok, measured, maximum, f"{what} {measured:.4g} {'<=' if ok else '>'} {maximum:.4g}")


def select(verdicts: list[Verdict], rule: str) -> str | None:
    """`fastest-passing`: most samples/s (unmeasured speed ranks last); ties and `smallest-passing`: smaller file.
    None when no candidate passed (the caller falls back to the baseline)."""
    passing = [v for v in verdicts if v.passed]
    if not passing:
        return None
    if rule == "fastest-passing":
        best = min(passing, key=lambda v: (-(v.speed or 0.0), v.bytes or 0))
    else:
        best = min(passing, key=lambda v: (v.bytes or 0, -(v.speed or 0.0)))
    return best.name
