"""Interleaved throughput of every (model, engine) pair, paired round by round with the reference.

For each batch size every pair takes its turn in slices of duration_s / ROUNDS on sessions created
once, in an order that rotates every round, so noise from other processes hits every pair alike and
each round's ratio (pair over reference, the baseline on the first engine) is a paired sample.
After ROUNDS rounds, the pairs still undecided (a speed gate, or at the ranking batch size whether
they beat the reference at all) go on, round by round, until each is decided or the budget is spent.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from temper.artifacts.host import Load, LoadMeter
from temper.artifacts.layout import AXIS0, Layout
from temper.validators.pairs import Pair
from temper.validators.spec import ThroughputSpec
from temper.validators.speedup import Speedup, estimate
from temper.validators.throughput import Measurement, Session, measure, tuned_session

ROUNDS = 5  # rounds every pair gets; more only while a speed gate is undecided
SLICE_WARMUP_S = 0.05  # later slices reuse a warm session: a few calls re-fill the caches

Progress = Callable[[str], None]


@dataclass
class Bench:
    """One batch size: every pair's slices by round, and what else ran meanwhile."""

    batch_size: int
    reference: str  # the pair key every ratio divides by
    slices: dict[str, dict[int, Measurement]]  # pair key -> round -> slice
    load: Load | None = None

    def ratios(self, key: str) -> list[float]:
        """Paired per-round ratios: the pair's slice over the reference's slice of the same round."""
        base = self.slices[self.reference]
        return [m.samples_per_s / base[r].samples_per_s for r, m in self.slices[key].items() if r in base]

    def figure(self, key: str) -> Measurement:
        """The pair's median slice, carrying the round count, the spread and the load."""
        taken = sorted(self.slices[key].values(), key=lambda m: m.samples_per_s)
        median = taken[len(taken) // 2]
        spread = 100 * (taken[-1].samples_per_s - taken[0].samples_per_s) / median.samples_per_s
        return replace(median, rounds=len(taken), spread_pct=round(spread, 2),
                       load=self.load.as_dict() if self.load else None)


def sessions(pairs: dict[str, tuple[Pair, Path]], sample: dict[str, np.ndarray], layout: Layout,
             progress: Progress) -> dict[str, Session]:
    """Each pair's session, threads chosen as serving chooses them (throughput.tuned_session)."""
    engines = list(dict.fromkeys(pair.engine for pair, _ in pairs.values()))
    opened: dict[str, Session] = {}
    for engine in engines:
        mine = {key: path for key, (pair, path) in pairs.items() if pair.engine == engine}
        progress(f"throughput › {engine}: sessions and thread choice for {', '.join(mine)}")
        opened |= {key: tuned_session(path, engine, sample, layout) for key, path in mine.items()}
    return opened


def bench_all(spec: ThroughputSpec | None, pairs: dict[str, tuple[Pair, Path]], reference: str,
              sample: dict[str, np.ndarray], progress: Progress, layout: Layout = AXIS0) -> list[Bench]:
    """Throughput of every pair at every batch size (the module's rule); the reference pair first."""
    if spec is None:
        return []
    opened = sessions(pairs, sample, layout, progress)
    benches = []
    slice_s = spec.duration_s / ROUNDS
    most_rounds = max(ROUNDS, round(spec.budget_s / slice_s))
    for size in spec.batch_sizes:
        progress(f"throughput › batch {size}: {', '.join(pairs)}")
        bench = Bench(size, reference, {key: {} for key in pairs})
        meter = LoadMeter()
        active = list(pairs)
        for round_ in range(most_rounds):
            shift = round_ % len(active)
            for key in active[shift:] + active[:shift]:
                pair, path = pairs[key]
                warmup = spec.warmup_s if round_ == 0 else min(spec.warmup_s, SLICE_WARMUP_S)
                bench.slices[key][round_] = measure(path, sample, size, pair.engine, slice_s, warmup,
                                                    session=opened[key], layout=layout)
            if round_ + 1 < ROUNDS:
                continue
            undecided = [key for key in active if key != reference
                         and undecided_at(estimate(bench.ratios(key), spec.confidence), size, spec)]
            if not undecided:
                break
            if round_ + 1 < most_rounds:
                progress(f"throughput › batch {size}: more rounds for {', '.join(undecided)} (round {round_ + 2})")
            active = [reference, *undecided]
        bench.load = meter.read()
        benches.append(bench)
    return benches


def undecided_at(up: Speedup, size: int, spec: ThroughputSpec) -> bool:
    """Whether more rounds could settle something: a speed gate at `size`, or, at the ranking batch
    size, whether the pair is faster than the reference at all (selection's rule)."""
    gate = (spec.min_speedup is not None and size in spec.gated_sizes
            and up.decide(spec.min_speedup) == "undecided")
    ranking = size == max(spec.batch_sizes) and up.decide(1.0) == "undecided"
    return gate or ranking
