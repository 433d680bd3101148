"""Speedup as an interval, and a gate verdict that tells noise from a real difference.

Each round times the baseline and a candidate back to back, so a burst of load hits both; the
round's ratio (candidate / baseline samples/s) is one paired observation. The speedup is the
geometric mean of those ratios, with a Student-t confidence interval on their logs: a paired
t-interval, honest at the 5-15 rounds a gate can afford (a bootstrap of 5 ratios can only
reshuffle those 5 values and gives intervals that are too narrow). A gate passes when the
interval's lower end clears the minimum, fails when its upper end is below it, and otherwise
asks for more rounds until the recipe's time budget is spent: then it is inconclusive.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy import stats

Decision = Literal["pass", "fail", "undecided"]


@dataclass(frozen=True)
class Speedup:
    ratio: float  # geometric mean of the per-round ratios
    low: float | None  # the confidence interval; None below two rounds
    high: float | None
    rounds: int
    confidence: float

    def decide(self, minimum: float) -> Decision:
        if self.low is None or self.high is None:
            return "undecided"
        if self.low >= minimum:
            return "pass"
        if self.high < minimum:
            return "fail"
        return "undecided"

    def shown(self) -> str:
        """`1.40x [1.36, 1.44]`: the estimate and its interval, for reports and gate details."""
        interval = f" [{self.low:.2f}, {self.high:.2f}]" if self.low is not None and self.high is not None else ""
        return f"{self.ratio:.2f}x{interval}"


def estimate(ratios: Sequence[float], confidence: float) -> Speedup:
    """The speedup from paired per-round ratios (all > 0) at `confidence` (0 < c < 1)."""
    logs = np.log(np.asarray(ratios, dtype=np.float64))
    centre = float(logs.mean())
    if len(logs) < 2:
        return Speedup(math.exp(centre), None, None, len(logs), confidence)
    half = float(stats.t.ppf((1 + confidence) / 2, len(logs) - 1) * logs.std(ddof=1) / math.sqrt(len(logs)))
    return Speedup(math.exp(centre), math.exp(centre - half), math.exp(centre + half), len(logs), confidence)
