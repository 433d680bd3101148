"""validators.gates: the verdicts and the selection rule, on hand-made numbers."""

from __future__ import annotations

import numpy as np

from temper.validators.gates import Gate, Verdict, at_least, at_most, select


def _candidate(name: str, passed: bool = True, speed: float | None = None, size: int | None = None) -> Verdict:
    return Verdict(name, [Gate("build", passed, None, None, "")], bytes=size, speed=speed)


def test_at_least_holds_at_the_budget_and_says_so():
    gate = at_least("accuracy", 0.9, 0.9, "top1")
    assert (gate.passed, gate.verdict, gate.measured, gate.budget) == (True, "pass", 0.9, 0.9)
    assert gate.detail == "top1 0.9 >= 0.9"
    missed = at_least("accuracy", 0.8912345, 0.9, "top1")
    assert (missed.passed, missed.verdict, missed.detail) == (False, "fail", "top1 0.8912 < 0.9")


def test_at_most_holds_at_the_budget_and_says_so():
    assert at_most("drop", 0.01, 0.01, "drop").detail == "drop 0.01 <= 0.01"
    missed = at_most("drop", 0.025, 0.01, "drop")
    assert (missed.passed, missed.detail) == (False, "drop 0.025 > 0.01")


def test_numpy_numbers_give_a_plain_bool():
    """report.json is written with json: a numpy bool there would not serialise."""
    assert type(at_least("x", np.float32(1.0), 0.5, "x").passed) is bool
    assert type(at_most("x", np.float64(1.0), 0.5, "x").passed) is bool


def test_gate_keeps_an_explicit_verdict_and_its_interval():
    gate = Gate("throughput.cpu.b8", False, 1.1, 1.2, "inconclusive", verdict="inconclusive", interval=(0.9, 1.3))
    assert gate.verdict == "inconclusive" and gate.as_dict()["interval"] == (0.9, 1.3)


def test_a_verdict_without_gates_never_passes():
    assert not Verdict("empty").passed
    assert not Verdict("one-failed", [Gate("a", True, 1, 1, ""), Gate("b", False, 0, 1, "")]).passed


def test_no_passing_candidate_selects_nothing():
    assert select([], "fastest-passing") is None
    assert select([_candidate("a", passed=False, speed=9e9, size=1)], "smallest-passing") is None


def test_fastest_passing_ignores_failing_candidates():
    verdicts = [_candidate("fast-but-failed", False, 900.0, 10), _candidate("slow", True, 100.0, 10),
                _candidate("fast", True, 200.0, 50)]
    assert select(verdicts, "fastest-passing") == "fast"


def test_fastest_passing_breaks_a_speed_tie_by_the_smaller_file():
    verdicts = [_candidate("big", speed=100.0, size=50), _candidate("small", speed=100.0, size=10)]
    assert select(verdicts, "fastest-passing") == "small"


def test_unmeasured_speed_ranks_last():
    verdicts = [_candidate("unmeasured", speed=None, size=1), _candidate("measured", speed=0.5, size=999)]
    assert select(verdicts, "fastest-passing") == "measured"


def test_smallest_passing_prefers_the_smaller_file_then_the_faster():
    verdicts = [_candidate("fast", speed=500.0, size=40), _candidate("small-slow", speed=100.0, size=20),
                _candidate("small-fast", speed=200.0, size=20), _candidate("tiny-failed", False, 900.0, 1)]
    assert select(verdicts, "smallest-passing") == "small-fast"


def test_a_full_tie_keeps_recipe_order():
    verdicts = [_candidate("first", speed=100.0, size=10), _candidate("second", speed=100.0, size=10)]
    assert select(verdicts, "fastest-passing") == "first" and select(verdicts, "smallest-passing") == "first"
