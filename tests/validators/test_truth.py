"""The gates on what a graph is: a label its census contradicts fails, a true one adds no gate, and a
fallback that reached its floor without meeting the budget fails as "not reachable in INT8"."""

from __future__ import annotations

from temper.validators.census import Census
from temper.validators.truth import truth_gates


def test_a_label_the_census_contradicts_fails_and_a_true_one_adds_nothing():
    fp32 = Census(eligible=3, fp32=3)
    [gate] = truth_gates(fp32, "int8-static", None)
    assert (gate.name, gate.passed, gate.measured) == ("precision", False, 0.0)
    assert gate.detail == ("the recipe's steps make int8-static, but the graph is fp32: "
                           "3 eligible nodes: 0 quantized, 0 fp16, 3 fp32")
    assert truth_gates(Census(eligible=3, quantized=3), "int8-static", None) == []
    assert truth_gates(Census(eligible=2, quantized=2, dynamic=2), "int8-dynamic", None) == []
    assert [g.name for g in truth_gates(Census(eligible=2, quantized=2), "int8-dynamic", None)] == ["precision"]


def test_steps_that_convert_nothing_promise_nothing():
    """An already-quantized source model through simplify alone: labelled by its graph, no gate fails."""
    assert truth_gates(Census(eligible=3, quantized=3), "fp32", None) == []


def test_a_fallback_that_reached_its_floor_without_meeting_the_budget_fails():
    trial = {"quantized": 10, "drop": 0.2}
    tuning = {"met": False, "floor_reached": True, "floor": 5, "min_quantized": 0.5, "allowed_drop": 0.01,
              "best": 1, "trials": [trial, {**trial, "quantized": 6, "drop": 0.05}]}
    [gate] = truth_gates(Census(eligible=10, quantized=6), "int8-static", tuning)
    assert (gate.name, gate.passed, gate.measured, gate.budget) == ("fallback", False, 6.0, 5.0)
    assert gate.detail.startswith("budget not reachable in INT8: no trial keeping at least 5 quantized nodes "
                                  "(fallback.min_quantized 0.5 of the plain model's 10) held the budget; "
                                  "the best drops 0.0500 (allowed 0.0100) with 6 quantized")
    assert truth_gates(Census(eligible=10, quantized=6), "int8-static", {**tuning, "floor_reached": False}) == []
    assert truth_gates(Census(eligible=10, quantized=6), "int8-static", {**tuning, "met": True}) == []
