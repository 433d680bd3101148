"""The session settings search's rule, on constructed intervals: a row is kept only when its interval
over the default lies above 1.0 at the ranking batch size and below 1.0 at no batch size measured."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from temper.artifacts.engines.onnxruntime import SessionSettings
from temper.validators.session_search import Row, Trial, choose, rows_for, table
from temper.validators.speedup import Speedup


def _up(ratio: float, low: float | None, high: float | None) -> Speedup:
    return Speedup(ratio, low, high, 5, 0.95)


def _trial(name: str, **speedups: Speedup) -> Trial:
    return Trial(Row(name, {}), {}, {int(size.removeprefix("b")): up for size, up in speedups.items()})


def test_the_fastest_of_the_rows_faster_on_their_interval_is_kept():
    clear = _trial("clear", b1=_up(1.2, 1.05, 1.3), b8=_up(1.3, 1.1, 1.5))
    faster = _trial("faster", b1=_up(1.1, 0.95, 1.2), b8=_up(1.6, 1.2, 2.0))
    assert choose([clear, faster], ranking=8) is faster
    assert (clear.verdict(8), faster.verdict(8)) == ("faster", "faster")


def test_a_higher_point_estimate_whose_interval_straddles_one_is_not_kept():
    lucky = _trial("lucky", b8=_up(1.9, 0.8, 4.5))
    modest = _trial("modest", b8=_up(1.1, 1.02, 1.2))
    assert lucky.verdict(8) == "not faster"
    assert choose([lucky, modest], ranking=8) is modest
    assert choose([lucky], ranking=8) is None  # the default stays


def test_a_row_slower_on_its_interval_at_any_batch_size_is_never_kept():
    """Faster where selection ranks, but its own interval says it is slower at batch 1."""
    split = _trial("split", b1=_up(0.7, 0.6, 0.8), b8=_up(1.5, 1.3, 1.7))
    assert split.verdict(8) == "slower"
    assert choose([split], ranking=8) is None


def test_faster_only_away_from_the_ranking_size_is_not_kept():
    small = _trial("small", b1=_up(1.6, 1.4, 1.8), b8=_up(1.0, 0.9, 1.1))
    assert small.verdict(8) == "not faster" and choose([small], ranking=8) is None


def test_one_round_has_no_interval_and_keeps_nothing():
    assert choose([_trial("once", b8=_up(3.0, None, None))], ranking=8) is None


def test_rows_that_change_nothing_on_this_host_are_not_timed():
    """One thread is the default on a one-core host: the row would compare the default with itself."""
    one_core = SessionSettings(intra_op_threads=1)
    assert [r.name for r in rows_for("cpu", one_core)] == ["spinning", "extended"]
    assert [r.name for r in rows_for("cpu", SessionSettings(intra_op_threads=2))] == [r.name for r in table("cpu")]
    # a GPU session takes no thread settings: CUDA graphs off (the default) and on is all there is to search
    assert [r.name for r in rows_for("cuda", one_core)] == ["cuda-graph"]


def test_a_row_applies_to_the_engines_settings_model_and_is_validated():
    default = SessionSettings(intra_op_threads=4)
    assert Row("x", {"graph_optimization": "extended"}).apply(default) == SessionSettings(
        intra_op_threads=4, graph_optimization="extended")
    with pytest.raises(ValidationError):
        Row("bad", {"graph_optimization": "fastest"}).apply(default)
