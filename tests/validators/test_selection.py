"""Selection against the baseline on the real digits recipe, through the installed console script:
with no speed gate at all, a candidate is selected only when its measured speedup interval lies
above 1.0. No timing assertions: the rule is checked against the numbers report.json records."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import edit_recipe
from tests.unit.reports import read_report

TEMPER = str(Path(sys.executable).parent / "temper")


def _fidelity_budget_only(d: dict) -> None:
    """What a user who wrote only quality budgets gets: speed is measured, never gated."""
    throughput = d["validate"]["throughput"]
    del throughput["min_speedup"], throughput["speedup_at"]
    throughput.update(duration_s=0.6, warmup_s=0.1)
    del d["publish"]


@pytest.mark.slow
def test_without_min_speedup_only_a_candidate_faster_on_its_interval_beats_the_baseline(digits_dir, tmp_path):
    recipe = digits_dir / "digits-cnn.yaml"
    edit_recipe(recipe, _fidelity_budget_only)
    out = tmp_path / "out"
    result = subprocess.run([TEMPER, "run", str(recipe), "--output", str(out)], capture_output=True, text=True,
                            timeout=900)
    assert result.returncode == 0, result.stderr
    report = read_report(out)
    assert report["speed_policy"]["min_speedup"] is None
    ranked_at = {"provider": "cpu", "batch_size": 32}

    def at_ranking_size(name: str) -> dict:
        return next(m for m in report["candidates"][name]["throughput"]
                    if all(m[k] == v for k, v in ranked_at.items()))

    passing = [n for n, c in report["candidates"].items() if c["passed"]]
    assert passing, "the quality budgets alone should let some digits candidate pass"
    faster = [n for n in passing if (i := at_ranking_size(n)["speedup_interval"]) and i[0] > 1.0]
    if faster:  # the largest speedup, or a pair tied with it on their paired interval (more faithful)
        leader = max(faster, key=lambda n: at_ranking_size(n)["speedup"])
        expected = report["selected"]
        assert expected == leader or (expected in faster and leader in {t["pair"] for t in report["ties"]})
        assert (report["selected"], report["passed"]) == (expected, True)
        assert report["selection_reason"].startswith(f"{expected} passed every gate and is ")
        assert f"selected: {expected}" in result.stdout
    else:
        assert report["selected"] == "baseline" and report["passed"] is False
        reason = report["selection_reason"]
        assert reason.startswith("no candidate that passed every gate is faster than the baseline"), reason
        for name in passing:
            low, high = at_ranking_size(name)["speedup_interval"]
            assert f"{name} passed every gate but is " in reason
            assert f"[{low:.2f}, {high:.2f}]" in reason
        assert "selected: baseline" in result.stdout and reason.split(":")[0] in result.stdout
    for name in report["candidates"]:  # every candidate not selected over the baseline shows why in numbers
        if name != report["selected"] and name in passing and name not in faster:
            assert at_ranking_size(name)["speedup_interval"][0] <= 1.0


def test_fastest_passing_without_any_speed_measured_selects_the_baseline_and_says_so(temper, tmp_path):
    """No validate.throughput: nothing shows the fp16 candidate faster, so it is not published over FP32."""
    from tests.validators.test_gate_errors import _recipe, _write

    recipe = _write(tmp_path, _recipe(tmp_path, {"accuracy": {"metric": "top1", "max_drop": 0.5}}))
    out = tmp_path / "out"
    result = temper("run", recipe, "--output", out)
    assert result.code == 0, result.stderr
    report = read_report(out)
    assert report["candidates"]["fp16"]["passed"] and report["speed_policy"] is None
    assert (report["selected"], report["passed"]) == ("baseline", False)
    assert "fp16 passed every gate but speed was not measured (no validate.throughput)" in report["selection_reason"]
    assert "selected: baseline" in result.stdout and "speed was not measured" in result.stdout


def test_smallest_passing_selects_a_candidate_smaller_than_the_baseline(temper, tmp_path):
    from tests.validators.test_gate_errors import _recipe, _write

    data = _recipe(tmp_path, {"accuracy": {"metric": "cosine", "max_drop": 0.5}}, width=64)
    data["select"] = "smallest-passing"
    recipe = _write(tmp_path, data)
    out = tmp_path / "out"
    assert temper("run", recipe, "--output", out).code == 0
    report = read_report(out)
    fp16, baseline = report["candidates"]["fp16"], out / "baseline" / "model.onnx"
    assert fp16["passed"] and fp16["bytes"] < baseline.stat().st_size  # FP16 weights: half the bytes
    assert report["selected"] == "fp16"
    assert report["selection_reason"].startswith("fp16 passed every gate and is the smallest: ")
