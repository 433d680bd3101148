"""Interleaved rounds: the timing loop behind every paired speed comparison temper makes.

The speed gates (validators/benches.py) compare each (model, engine) pair with the reference pair, and
the session settings search (validators/session_search.py) compares each setting with the default one,
the same way: sessions built once, each model or setting timed in slices that take turns in an order rotating
every round, so a burst of load hits all alike; the round's ratio to the reference is one paired
observation for validators/speedup.py's interval. After ROUNDS rounds, only the reference and those
still undecided go on, round by round, up to a bound; with a deadline (the session search's budget), no
round starts that the last one's length says would end past it.

Before a batch size's rounds, a session with CUDA graphs on (artifacts/engines/cuda_graphs.py) has its graph
path compared with its plain run at that size, on the timed batch and on one it was not captured with: a
replay that answers another batch's numbers fails there in one line, before any figure is recorded.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import onnx

from temper.artifacts import engines
from temper.artifacts.core.errors import StepFailed
from temper.artifacts.core.host import Load, LoadMeter
from temper.artifacts.core.layout import Layout
from temper.artifacts.core.onnx_io import load_structure
from temper.artifacts.engines.providers import Provider
from temper.validators.throughput import Measurement, Session, batch_of, measure

ROUNDS = 5  # rounds every model gets; more only while a comparison is undecided
SLICE_WARMUP_S = 0.05  # later slices reuse a warm session: a few calls re-fill the caches


@dataclass
class Bench:
    """One batch size: every timed key's slices by round, and what else ran meanwhile."""

    batch_size: int
    reference: str  # the key every ratio is taken over
    slices: dict[str, dict[int, Measurement]]  # key -> round -> slice
    load: Load | None = None
    round_s: list[float] = field(default_factory=list)  # each round's wall time, in order
    cut_short: bool = False  # the deadline stopped the rounds before the rule did

    def ratios(self, name: str, over: str | None = None) -> list[float]:
        """Paired per-round ratios: `name`'s slice over the slice of the same round of `over` (the reference)."""
        base = self.slices[over or self.reference]
        return [m.samples_per_s / base[r].samples_per_s for r, m in self.slices[name].items() if r in base]

    def figure(self, name: str) -> Measurement:
        """The model's median slice, carrying the round count, the spread and the load."""
        taken = sorted(self.slices[name].values(), key=lambda m: m.samples_per_s)
        median = taken[len(taken) // 2]
        spread = 100 * (taken[-1].samples_per_s - taken[0].samples_per_s) / median.samples_per_s
        return replace(median, rounds=len(taken), spread_pct=round(spread, 2),
                       load=self.load.as_dict() if self.load else None)


@dataclass(frozen=True)
class Timing:
    """How one bench is timed: the slice, the first slice's warm-up, the most rounds, and the
    time.perf_counter() after which no round may end (None: the rounds alone bound it)."""

    slice_s: float
    warmup_s: float
    most_rounds: int
    deadline: float | None = None


def interleave(bench: Bench, sessions: dict[str, Session], paths: dict[str, tuple[Path, Provider]],
               sample: dict[str, np.ndarray], layout: Layout, timing: Timing,
               undecided: Callable[[Bench, str], bool], more: Callable[[Bench, int, list[str]], None] = lambda *_: None,
               ) -> Bench:
    """Time every session of `sessions` (the reference first; `paths`: each key's model and engine, a
    provider of artifacts/engines/providers.py) in rotating rounds into `bench`: ROUNDS
    rounds, then the reference and each `undecided(bench, name)` one, until none is or `most_rounds`
    ran, or until the next round, as long as the last one, would end past `timing.deadline` (the first
    round always runs). `more(bench, next_round, names)` hears each extra round before it runs."""
    meter = LoadMeter()
    active = list(sessions)
    graphs = {path: load_structure(path) for path, _ in paths.values()}  # read once, not once a slice
    feeds = {name: batch_of(graphs[paths[name][0]], sample, bench.batch_size, layout) for name in sessions}
    problems = replay_problems(sessions, feeds, graphs, paths, sample, bench.batch_size, layout)
    if problems:
        name, problem = next(iter(problems.items()))
        raise StepFailed(f"{name}: CUDA graph replay at batch {bench.batch_size}: {problem}; "
                         "gate it with cuda_graph off")
    for round_ in range(timing.most_rounds):
        began = time.perf_counter()
        if round_ and timing.deadline is not None and began + bench.round_s[-1] > timing.deadline:
            bench.cut_short = True
            break
        shift = round_ % len(active)
        for name in active[shift:] + active[:shift]:
            warmup = timing.warmup_s if round_ == 0 else min(timing.warmup_s, SLICE_WARMUP_S)
            path, engine = paths[name]
            bench.slices[name][round_] = measure(path, sample, bench.batch_size, engine, timing.slice_s, warmup,
                                                 session=sessions[name], layout=layout, feed=feeds[name])
        bench.round_s.append(time.perf_counter() - began)
        if round_ + 1 < ROUNDS:
            continue
        still = [name for name in active if name != bench.reference and undecided(bench, name)]
        if not still:
            break
        if round_ + 1 < timing.most_rounds:
            more(bench, round_ + 2, still)
        active = [bench.reference, *still]
    bench.load = meter.read()
    return bench


def replay_problems(sessions: dict[str, Session], feeds: dict[str, dict[str, np.ndarray]],
                    graphs: dict[Path, onnx.ModelProto], paths: dict[str, tuple[Path, Provider]],
                    sample: dict[str, np.ndarray], size: int, layout: Layout) -> dict[str, str]:
    """Each session whose CUDA-graph path answers differently from its plain run at batch `size` (on its
    timed batch, then on the sample's rows shifted by one, which no graph was captured with), and how."""
    shifted = {key: np.roll(value, -1, axis=0) if np.ndim(value) else value for key, value in sample.items()}
    found = {}
    for name, session in sessions.items():
        if not engines.uses_graphs(session):  # nothing to compare: no second batch built
            continue
        graph = graphs[paths[name][0]]
        other = batch_of(graph, shifted, size, layout)
        problem = engines.replay_problem(session, [feeds[name], other])
        if problem is not None:
            found[name] = problem
    return found
