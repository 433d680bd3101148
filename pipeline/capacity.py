"""`temper capacity`: the highest request rate a bundle serves behind `temper serve` with its p99 latency under a
target, and the serving configuration (max batch size, max queue delay, instances) that reaches it.

The search is small on purpose (a 2-core box cannot afford Model Analyzer's full grid): one dimension at a time,
starting from the first value of each list (the bundle's own batching and one instance), as Model Analyzer's quick
search does.
- The first configuration's knee: open-loop runs at a doubling rate from `start_rate` until one breaks the target
  (p99 over it, a request unanswered, or the rate not really offered), then `steps` geometric bisections between
  the last rate under and the first over.
- Every other configuration is first offered the best knee so far: under it, it climbs and bisects the same way
  (it may beat the best); over it, the point is run once more, and only over it twice is the configuration
  pruned (two runs): one noisy point must not rule out a dimension, as the search changes one at a time and
  never comes back to a value it pruned.
- The chosen configuration is the one whose measured point under the target has the highest rate.
- Its knee is then measured again `rounds` times, each on a fresh server, from the knee found (steps of 1.25x up or
  down, then the bisections): the knees' median is the capacity, with their spread and a 95% t-interval.
Every run is perf_analyzer against a real `temper serve` (pipeline/capacity_load.py).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from temper.artifacts.core.errors import TemperError
from temper.artifacts.core.host import profile
from temper.artifacts.formats.bundle import ServingConfig
from temper.artifacts.formats.capacity import Capacity, Choice, Point
from temper.pipeline.capacity_load import Load, offer, served

ROUND_FACTOR = 1.25


class NoCapacity(TemperError):
    """No rate tried kept p99 under the target (exit 1: a measured outcome, like a failed candidate)."""


@dataclass(frozen=True)
class Search:
    target_ms: float
    batch_sizes: list[int]
    delays_ms: list[float]
    instances: list[int]
    start_rate: float = 20.0
    ceiling: float = 20_000.0
    floor: float = 1.0
    steps: int = 3
    rounds: int = 2

    def dimensions(self) -> list[tuple[str, list]]:
        return [("instances", self.instances), ("max_batch_size", self.batch_sizes),
                ("max_delay_ms", self.delays_ms)]


@dataclass
class _Log:
    """Every point measured, in order, and who hears of each."""

    tell: Callable[[Point], None]
    points: list[Point] = field(default_factory=list)

    def add(self, point: Point) -> bool:
        self.points.append(point)
        self.tell(point)
        return point.under


def climb(at: Callable[[float], bool], start: float, factor: float, search: Search, prune: bool = False) -> None:
    """Find the knee: `at(rate)` runs one point and says whether it was under the target."""
    low = high = None
    rate = start
    if at(rate) or (prune and at(rate)):  # a configuration is pruned on two points over, not one
        low = rate
        while (rate := rate * factor) <= search.ceiling:
            if not at(rate):
                high = rate
                break
            low = rate
    elif prune:
        return
    else:
        high = rate
        while (rate := rate / factor) >= search.floor:
            if at(rate):
                low = rate
                break
            high = rate
    if low is None or high is None:
        return
    for _ in range(search.steps):
        middle = math.sqrt(low * high)
        if at(middle):
            low = middle
        else:
            high = middle


def knee(points: list[Point], choice: Choice, round_: int = 0) -> Point | None:
    """The highest-rate point under the target among `choice`'s in a round (ties: the first measured)."""
    under = [p for p in points if p.under and p.choice == choice and p.round == round_]
    return max(under, key=lambda p: p.rate, default=None)


def measure(bundle: Path, config: ServingConfig, search: Search, load: Load,
            tell: Callable[[Point], None] = lambda point: None) -> Capacity:
    tool = load.version()  # before any server starts: a missing perf_analyzer is one line
    log = _Log(tell)

    def run(choice: Choice, start: float, factor: float, prune: bool, round_: int = 0) -> None:
        with served(bundle, config, choice) as server:
            climb(lambda rate: log.add(offer(load, server, choice, rate, search.target_ms, round_)), start, factor,
                  search, prune)

    best = Choice(max_batch_size=search.batch_sizes[0], max_delay_ms=search.delays_ms[0],
                  instances=search.instances[0])
    run(best, search.start_rate, 2.0, prune=False)
    tried = {best}
    for name, values in search.dimensions():
        for value in values:
            choice = best.model_copy(update={name: value})
            if choice in tried:
                continue
            tried.add(choice)
            top = knee(log.points, best)
            if top is None:  # nothing passed yet: this one gets a full search of its own
                run(choice, search.start_rate, 2.0, prune=False)
            else:
                run(choice, top.rate, 2.0, prune=True)
            found = knee(log.points, choice)
            if found is not None and (top is None or found.rate > top.rate):
                best = choice
    chosen = max((p for p in log.points if p.under and p.round == 0), key=lambda p: p.rate, default=None)
    if chosen is None:
        raise NoCapacity(f"{config.name}: no rate down to {search.floor:g} requests/s kept p99 under "
                         f"{search.target_ms:g} ms with any configuration tried: the target is below what this host "
                         "serves; raise --p99-ms or measure on a faster host")
    knees = [chosen.rate]
    for round_ in range(1, search.rounds + 1):
        run(chosen.choice, chosen.rate, ROUND_FACTOR, prune=False, round_=round_)
        again = knee(log.points, chosen.choice, round_)
        knees.append(again.rate if again is not None else 0.0)
    return _record(config, search, load, tool, chosen, knees, log.points)


def _record(config: ServingConfig, search: Search, load: Load, tool: str, chosen: Point, knees: list[float],
            points: list[Point]) -> Capacity:
    del config
    low, high = interval(knees)
    answered = chosen.answered
    memory = [p.memory_bytes for p in points if p.choice == chosen.choice and p.memory_bytes]
    return Capacity(
        target_p99_ms=search.target_ms, chosen=chosen.choice, rate=round(statistics.median(knees), 3),
        knees=knees, interval=(round(low, 3), round(high, 3)), p99_ms=chosen.p99_ms or 0.0,
        queue_us=chosen.queue_us, in_flight=round(answered * (chosen.mean_ms or 0.0) / 1000, 4),
        queued=round(answered * (chosen.queue_us or 0.0) / 1e6, 4), memory_bytes=max(memory, default=None),
        protocol=load.protocol, tool=tool, measured_on=profile(),
        measured_at=datetime.now(UTC).isoformat(timespec="seconds"), points=points)


def interval(values: list[float]) -> tuple[float, float]:
    """The 95% t-interval of the values' mean (the value itself for one)."""
    from scipy import stats

    if len(values) < 2:
        return values[0], values[0]
    mean, spread = statistics.fmean(values), statistics.stdev(values)
    half = float(stats.t.ppf(0.975, len(values) - 1)) * spread / math.sqrt(len(values))
    return max(0.0, mean - half), mean + half
