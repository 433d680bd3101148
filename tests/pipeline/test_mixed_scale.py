"""The default fidelity gate on a mixed-scale output (issue 33.1): a detector-like output [batch, 22] holding 4
box rows in the hundreds beside 18 class-score rows in [0, 1]. Its static INT8 model (one per-tensor scale over
both parts) keeps the boxes and ruins the scores, with a whole-output cosine above 0.999; with the recipe a
user writes first (`cosine_min: 0.99`, no slices) the worst row's gate must fail it, and `temper check` must
name the output and suggest the slice."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.helpers import MIXED, STATIC_INT8, mixed_model, write_recipe
from tests.unit.reports import read_report

BOXES, CLASSES = 4, 18


def mixed_recipe(folder: Path, fidelity: dict | None = None, **extra: object) -> Path:
    mixed_model(folder / "mixed.onnx", classes=CLASSES, boxes=BOXES)
    rng = np.random.default_rng(1)
    calibration, evaluation = (rng.random((64, 4), dtype=np.float32) for _ in range(2))
    return write_recipe(folder, "mixed", MIXED, {"x": calibration}, {"int8-static": STATIC_INT8},
                        {"fidelity": fidelity or {"cosine_min": 0.99}}, evaluation={"x": evaluation}, **extra)


def test_the_default_fidelity_gate_fails_the_int8_model_a_whole_output_cosine_passes(temper, tmp_path):
    recipe = mixed_recipe(tmp_path)
    out = tmp_path / "out"
    result = temper("run", recipe, "--output", out)
    assert result.code == 0, result.stderr
    report = read_report(out)
    candidate = report["candidates"]["int8-static"]
    gates = {g["name"]: g for g in candidate["gates"]}
    assert gates["fidelity.out.cosine"]["passed"] and gates["fidelity.out.cosine"]["measured"] > 0.999
    row = gates["fidelity.out.row_cosine"]
    assert not row["passed"] and row["budget"] == 0.99, row
    assert row["detail"].startswith("worst row cosine to baseline (out[axis 1] index "), row["detail"]
    worst = candidate["fidelity"][0]["worst_row"]
    assert worst["axis"] == 1 and worst["rows"] == BOXES + CLASSES and worst["index"] >= BOXES  # a score row
    assert worst["spread"] > 100  # the rows differ in scale by orders of magnitude
    assert not candidate["passed"] and report["selected"] == "baseline"
    markdown = (out / "report.md").read_text()
    assert "worst row" in markdown and f"index {worst['index']} of 22" in markdown
    assert "fidelity.out.row_cosine" in result.stdout


def test_the_row_gate_has_its_own_bound_and_can_be_turned_off(temper, tmp_path):
    out = tmp_path / "out"
    recipe = mixed_recipe(tmp_path, {"cosine_min": 0.99, "rows": False})
    assert temper("run", recipe, "--output", out).code == 0
    gates = {g["name"] for g in read_report(out)["candidates"]["int8-static"]["gates"]}
    assert "fidelity.out.row_cosine" not in gates and "fidelity.out.cosine" in gates
    recipe = mixed_recipe(tmp_path, {"row_cosine_min": -0.5})
    assert temper("validate", recipe, "--output", out).code == 0
    row = next(g for g in read_report(out)["candidates"]["int8-static"]["gates"]
               if g["name"] == "fidelity.out.row_cosine")
    assert row["budget"] == -0.5


def test_check_names_a_mixed_scale_output_and_suggests_a_slice(temper, tmp_path):
    result = temper("check", mixed_recipe(tmp_path))
    assert result.code == 0, result.stderr
    text = " ".join(result.stdout.split())
    assert "output 'out'" in text and "differ in scale" in text, text
    assert "{output: out, axis: 1, start: 4, stop: 22, cosine_min: 0.99}" in text, text
