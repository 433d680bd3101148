"""The speed gate's statistics, on ratios with known answers: no models, no timing."""

from __future__ import annotations

import math

import numpy as np
import pytest

from temper.validators.speedup import estimate


def test_the_estimate_is_the_geometric_mean_of_the_paired_ratios():
    up = estimate([1.2, 1.5, 1.0, 1.8, 1.35], 0.95)
    assert up.ratio == pytest.approx(math.prod([1.2, 1.5, 1.0, 1.8, 1.35]) ** (1 / 5))
    assert up.low < up.ratio < up.high and up.rounds == 5


def test_the_interval_is_a_student_t_interval_on_the_logs():
    ratios = [1.31, 1.42, 1.38, 1.29, 1.45, 1.36]
    logs = np.log(ratios)
    half = 2.570582 * logs.std(ddof=1) / math.sqrt(len(logs))  # t(0.975, 5 degrees of freedom)
    up = estimate(ratios, 0.95)
    assert up.low == pytest.approx(math.exp(logs.mean() - half), rel=1e-6)
    assert up.high == pytest.approx(math.exp(logs.mean() + half), rel=1e-6)
    assert estimate(ratios, 0.99).low < up.low  # more confidence, a wider interval


def test_a_clear_win_passes_a_clear_loss_fails_and_noise_around_the_bar_is_undecided():
    assert estimate([1.52, 1.55, 1.49, 1.51, 1.54], 0.95).decide(1.2) == "pass"
    assert estimate([0.79, 0.81, 0.78, 0.80, 0.82], 0.95).decide(1.2) == "fail"
    # a loaded machine: the same candidate reads 0.9x to 1.6x round by round
    noisy = estimate([0.92, 1.27, 0.98, 1.6, 1.1], 0.95)
    assert noisy.low < 1.2 < noisy.high and noisy.decide(1.2) == "undecided"


def test_more_rounds_of_the_same_noise_decide():
    rounds = [1.1, 1.5, 1.2, 1.45, 1.3]
    few, many = estimate(rounds, 0.95), estimate(rounds * 12, 0.95)
    assert few.decide(1.2) == "undecided" and many.decide(1.2) == "pass"
    assert many.high - many.low < few.high - few.low


def test_one_round_has_no_interval_and_decides_nothing():
    up = estimate([2.0], 0.95)
    assert up.ratio == pytest.approx(2.0) and up.low is None and up.high is None
    assert up.decide(1.2) == "undecided" and up.shown() == "2.00x"


def test_shown_gives_the_estimate_and_its_interval():
    assert estimate([1.0, 1.0, 1.0], 0.95).shown() == "1.00x [1.00, 1.00]"
