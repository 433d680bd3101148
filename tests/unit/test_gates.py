"""validators.gates: the verdicts and the selection rule, on hand-made numbers."""

from __future__ import annotations

import numpy as np

from temper.validators.gates import Gate, Verdict, at_least, at_most, beats_baseline, select
from temper.validators.speedup import Speedup, estimate

BASE_BYTES = 100  # the baseline's file size in the selection tests
FASTER = Speedup(1.5, 1.3, 1.7, 5, 0.95)  # an interval wholly above 1.0


def _candidate(name: str, passed: bool = True, speed: float | None = None, size: int | None = None,
               speedup: Speedup | None = FASTER) -> Verdict:
    return Verdict(name, [Gate("build", passed, None, None, "", kind="build")], bytes=size, speed=speed,
                   speedup=speedup)


def test_at_least_holds_at_the_budget_and_says_so():
    gate = at_least("accuracy", "accuracy", 0.9, 0.9, "top1")
    assert (gate.passed, gate.verdict, gate.measured, gate.budget) == (True, "pass", 0.9, 0.9)
    assert gate.detail == "top1 0.9 >= 0.9"
    missed = at_least("accuracy", "accuracy", 0.8912345, 0.9, "top1")
    assert (missed.passed, missed.verdict, missed.detail) == (False, "fail", "top1 0.8912 < 0.9")


def test_at_most_holds_at_the_budget_and_says_so():
    assert at_most("accuracy", "drop", 0.01, 0.01, "drop").detail == "drop 0.01 <= 0.01"
    missed = at_most("accuracy", "drop", 0.025, 0.01, "drop")
    assert (missed.passed, missed.detail) == (False, "drop 0.025 > 0.01")


def test_numpy_numbers_give_a_plain_bool():
    """report.json is written with json: a numpy bool there would not serialise."""
    assert type(at_least("fidelity", "x", np.float32(1.0), 0.5, "x").passed) is bool
    assert type(at_most("fidelity", "x", np.float64(1.0), 0.5, "x").passed) is bool


def test_gate_keeps_an_explicit_verdict_and_its_interval():
    gate = Gate("throughput.cpu.b8", False, 1.1, 1.2, "inconclusive", verdict="inconclusive", interval=(0.9, 1.3),
                kind="throughput", provider="cpu", batch_size=8)
    assert gate.verdict == "inconclusive" and gate.as_dict()["interval"] == (0.9, 1.3)


def test_a_verdict_without_gates_never_passes():
    assert not Verdict("empty").passed
    gates = [Gate("a", True, 1, 1, "", kind="accuracy"), Gate("b", False, 0, 1, "", kind="fidelity")]
    assert not Verdict("one-failed", gates).passed


def test_no_passing_candidate_selects_nothing():
    assert select([], "fastest-passing", BASE_BYTES).name is None
    assert select([_candidate("a", passed=False, speed=9e9, size=1)], "smallest-passing", BASE_BYTES).name is None


def _apart(table: dict[tuple[str, str], Speedup]):
    """A versus() from hand-made paired intervals: (a, b) -> a over b, and b over a its inverse."""
    def versus(a: str, b: str) -> Speedup | None:
        if (a, b) in table:
            return table[(a, b)]
        up = table.get((b, a))
        return None if up is None else Speedup(1 / up.ratio, 1 / up.high, 1 / up.low, up.rounds, up.confidence)
    return versus


CLEARLY = Speedup(1.5, 1.3, 1.7, 5, 0.95)  # a paired interval wholly above 1.0: no tie
WITHIN = Speedup(1.06, 0.95, 1.18, 5, 0.95)  # one holding 1.0: a tie


def test_fastest_passing_ignores_failing_candidates():
    verdicts = [_candidate("fast-but-failed", False, 900.0, 10, Speedup(9.0, 8.0, 10.0, 5, 0.95)),
                _candidate("slow", True, 100.0, 10, Speedup(1.5, 1.3, 1.7, 5, 0.95)),
                _candidate("fast", True, 200.0, 50, Speedup(3.0, 2.6, 3.4, 5, 0.95))]
    assert select(verdicts, "fastest-passing", BASE_BYTES, _apart({("fast", "slow"): CLEARLY})).name == "fast"


def test_fastest_passing_ranks_on_the_paired_speedup_not_the_median_samples():
    """resnet18 (issue 33.2): the pair with more median samples/s but the smaller speedup over the reference
    was selected; the ranking is the speedup, and a clear paired interval keeps the leader."""
    median_faster = _candidate("int8@openvino-bf16", speed=1000.0, size=50, speedup=Speedup(3.53, 2.30, 5.41, 5, 0.95))
    leader = _candidate("int8@openvino", speed=990.0, size=50, speedup=Speedup(3.69, 2.64, 5.16, 5, 0.95))
    chosen = select([median_faster, leader], "fastest-passing", BASE_BYTES,
                    _apart({("int8@openvino", "int8@openvino-bf16"): CLEARLY}))
    assert (chosen.name, chosen.ties) == ("int8@openvino", [])


def test_a_tie_on_the_paired_interval_goes_to_the_more_faithful_pair():
    """PP-OCRv4 det (issue 33.2): fp16 (cosine 0.9946) and the baseline (0.9988) on openvino-bf16 are 1.06x
    [0.95, 1.18] apart: a tie, which the more faithful pair wins, and the selection names the tie."""
    fp16 = _candidate("fp16@openvino-bf16", speed=1060.0, size=50, speedup=Speedup(1.6, 1.4, 1.8, 5, 0.95))
    base = _candidate("baseline@openvino-bf16", speed=1000.0, size=100, speedup=Speedup(1.5, 1.3, 1.7, 5, 0.95))
    fp16.fidelity, base.fidelity = 0.9946, 0.9988
    versus = _apart({("fp16@openvino-bf16", "baseline@openvino-bf16"): WITHIN})
    chosen = select([fp16, base], "fastest-passing", BASE_BYTES, versus)
    assert chosen.name == "baseline@openvino-bf16" and chosen.leader == "fp16@openvino-bf16"
    (tie,) = chosen.ties
    assert (tie.name, tie.fidelity) == ("fp16@openvino-bf16", 0.9946)
    assert tie.speedup is not None and tie.speedup.low < 1.0 < tie.speedup.high


def test_a_tie_with_equal_fidelity_goes_to_the_smaller_file_then_recipe_order():
    verdicts = [_candidate("big", speed=100.0, size=50), _candidate("small", speed=100.0, size=10)]
    assert select(verdicts, "fastest-passing", BASE_BYTES).name == "small"  # no paired interval: a tie
    verdicts = [_candidate("first", speed=100.0, size=10), _candidate("second", speed=100.0, size=10)]
    assert select(verdicts, "fastest-passing", BASE_BYTES).name == "first"
    assert select(verdicts, "smallest-passing", BASE_BYTES).name == "first"


def test_unmeasured_speed_ranks_last():
    verdicts = [_candidate("unmeasured", speed=None, size=1, speedup=None), _candidate("measured", speed=0.5, size=999)]
    assert select(verdicts, "fastest-passing", BASE_BYTES).name == "measured"


def test_smallest_passing_prefers_the_smaller_file_then_the_faster():
    verdicts = [_candidate("fast", speed=500.0, size=40, speedup=Speedup(5.0, 4.5, 5.5, 5, 0.95)),
                _candidate("small-slow", speed=100.0, size=20),
                _candidate("small-fast", speed=200.0, size=20, speedup=Speedup(2.0, 1.8, 2.2, 5, 0.95)),
                _candidate("tiny-failed", False, 900.0, 1)]
    assert select(verdicts, "smallest-passing", BASE_BYTES, _apart({("small-fast", "small-slow"): CLEARLY})
                  ).name == "small-fast"


# --- the baseline takes part: a candidate wins over it only on evidence


def test_a_passing_candidate_slower_than_the_baseline_is_not_selected():
    """fp16 measured 0.85x [0.62, 1.16]: passing every gate is not enough to be published over FP32."""
    slow = _candidate("fp16", speed=850.0, size=50, speedup=Speedup(0.85, 0.62, 1.16, 5, 0.95))
    assert select([slow], "fastest-passing", BASE_BYTES).name is None


def test_an_interval_straddling_one_is_not_evidence_of_being_faster():
    straddles = _candidate("noop", speed=1010.0, size=50, speedup=Speedup(1.01, 0.97, 1.05, 5, 0.95))
    touches = _candidate("edge", speed=1100.0, size=50, speedup=Speedup(1.1, 1.0, 1.2, 5, 0.95))
    assert straddles.passed and not beats_baseline(straddles, "fastest-passing", BASE_BYTES)
    assert not beats_baseline(touches, "fastest-passing", BASE_BYTES)  # "above 1.0", not "from 1.0"
    assert select([straddles, touches], "fastest-passing", BASE_BYTES).name is None


def test_a_faster_point_estimate_loses_to_a_candidate_faster_on_its_interval():
    """The fastest by samples/s is not eligible when its interval reaches below 1.0; the evidently
    faster one is selected even though it ranks lower."""
    noisy = _candidate("noisy", speed=2000.0, size=50, speedup=Speedup(1.9, 0.8, 4.5, 5, 0.95))
    steady = _candidate("steady", speed=1300.0, size=50, speedup=Speedup(1.3, 1.2, 1.4, 5, 0.95))
    assert select([noisy, steady], "fastest-passing", BASE_BYTES).name == "steady"


def test_unmeasured_speed_or_a_single_round_is_no_evidence():
    unmeasured = _candidate("unmeasured", speed=None, size=1, speedup=None)
    one_round = _candidate("one-round", speed=900.0, size=1, speedup=Speedup(3.0, None, None, 1, 0.95))
    assert select([unmeasured, one_round], "fastest-passing", BASE_BYTES).name is None


def test_a_failed_candidate_never_wins_however_fast():
    fast_failed = _candidate("fast-failed", passed=False, speed=9e9, size=1, speedup=Speedup(9.0, 8.0, 10.0, 5, 0.95))
    assert select([fast_failed], "fastest-passing", BASE_BYTES).name is None


def test_smallest_passing_needs_a_file_smaller_than_the_baseline():
    same = _candidate("fixed-shape", speed=1000.0, size=BASE_BYTES, speedup=None)
    bigger = _candidate("bigger", speed=1000.0, size=BASE_BYTES + 1, speedup=None)
    assert select([same, bigger], "smallest-passing", BASE_BYTES).name is None
    smaller = _candidate("smaller", speed=10.0, size=BASE_BYTES - 1, speedup=Speedup(0.5, 0.4, 0.6, 5, 0.95))
    assert select([same, bigger, smaller], "smallest-passing", BASE_BYTES).name == "smaller"  # size is its measure


def test_the_interval_decides_on_numbers_estimate_makes():
    """End to end through the statistics: ratios all above 1 but noisy straddle 1.0; tight ones clear it."""
    noisy = estimate([1.3, 0.8, 1.4, 0.9, 1.2], 0.95)
    tight = estimate([1.21, 1.19, 1.2, 1.22, 1.18], 0.95)
    assert noisy.ratio > 1.0 and noisy.low < 1.0 < tight.low
    verdicts = [_candidate("noisy", speed=1.0, size=1, speedup=noisy), _candidate("tight", speed=0.9, size=1,
                                                                                speedup=tight)]
    assert select(verdicts, "fastest-passing", BASE_BYTES).name == "tight"
