"""`temper capacity`'s knee search (pipeline/capacity.py climb) on scripted verdicts: which rates it offers, and when
a configuration offered the best knee so far is pruned. The real search against perf_analyzer and `temper serve`
is tests/pipeline/test_capacity.py; these pin the rule that one noisy point does not prune a configuration."""

from __future__ import annotations

from collections.abc import Callable

from temper.pipeline.capacity import Search, climb

SEARCH = Search(target_ms=15.0, batch_sizes=[16], delays_ms=[0.0], instances=[1, 2], steps=2)


def _scripted(knee: float, noisy: frozenset[float] = frozenset()) -> tuple[Callable[[float], bool], list[float]]:
    """A configuration whose p99 stays under the target up to `knee` req/s; the first run at a rate in `noisy` is
    over the target anyway (a load spike on the host)."""
    offered: list[float] = []

    def at(rate: float) -> bool:
        first = rate not in offered
        offered.append(rate)
        return rate <= knee and not (first and rate in noisy)

    return at, offered


def test_a_pruning_point_over_the_target_is_run_again_before_the_configuration_is_dropped() -> None:
    at, offered = _scripted(knee=150.0, noisy={42.0})
    climb(at, 42.0, 2.0, SEARCH, prune=True)
    assert offered[:2] == [42.0, 42.0]  # over once (noise), then under: it climbs
    assert offered[2:4] == [84.0, 168.0] and len(offered) == 4 + SEARCH.steps  # doubling, then the bisections
    assert max(r for r in offered if r <= 150.0) > 42.0  # it found a knee above the rate it was offered


def test_a_configuration_over_the_target_twice_is_pruned() -> None:
    at, offered = _scripted(knee=30.0)
    climb(at, 42.0, 2.0, SEARCH, prune=True)
    assert offered == [42.0, 42.0]  # two runs, no climb, no descent


def test_the_first_configuration_is_searched_down_from_an_over_start_without_repeats() -> None:
    at, offered = _scripted(knee=30.0)
    climb(at, 42.0, 2.0, SEARCH, prune=False)
    assert offered[:2] == [42.0, 21.0]  # not pruning: it halves at once to find a rate under the target
