"""Fidelity per slice of an output: a detector-like output [batch, 4 boxes in pixels + 6 class scores]
whose static INT8 model keeps the boxes and zeroes every score (one per-tensor scale over both parts)
passes a whole-output cosine of 0.99; the scores slice's own gate must fail it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from temper.validators.fidelity import compare_outputs, fidelity_gates
from temper.validators.spec import FidelityGate, ValidateSpec
from tests.helpers import MIXED, STATIC_INT8, mixed_model, write_recipe
from tests.unit.reports import read_report

SCORES = {"name": "scores", "output": "out", "axis": 1, "start": 4, "stop": 10, "cosine_min": 0.99}


def _recipe(folder: Path, fidelity: dict) -> Path:
    mixed_model(folder / "mixed.onnx")
    rng = np.random.default_rng(1)
    calibration, evaluation = (rng.random((64, 4), dtype=np.float32) for _ in range(2))
    return write_recipe(folder, "mixed", MIXED, {"x": calibration}, {"int8-static": STATIC_INT8},
                        {"fidelity": fidelity}, evaluation={"x": evaluation})


def test_a_slice_gate_fails_the_int8_model_a_whole_output_cosine_passes(temper, tmp_path):
    recipe = _recipe(tmp_path, {"cosine_min": 0.99, "rows": False,  # the slices alone (the row gate: test_mixed_scale)
                                "slices": [SCORES, {"output": "out", "axis": 1, "stop": 4, "rel_l2_max": 0.05}]})
    out = tmp_path / "out"
    result = temper("run", recipe, "--output", out)
    assert result.code == 0, result.stderr  # a failed gate: the baseline is selected, the CI contract holds
    report = read_report(out)
    gates = {g["name"]: g for g in report["candidates"]["int8-static"]["gates"]}
    assert gates["fidelity.out.cosine"]["passed"] and gates["fidelity.out.cosine"]["measured"] > 0.999
    assert not gates["fidelity.scores.cosine"]["passed"]
    assert gates["fidelity.scores.cosine"]["detail"].startswith("cosine to baseline of out[axis 1: 4:10] ")
    assert gates["fidelity.out.axis1.0-4.rel_l2"]["passed"]  # the boxes survive: only the scores broke
    assert report["selected"] == "baseline" and not report["passed"]
    sliced = {c["name"]: c["slice"] for c in report["candidates"]["int8-static"]["fidelity"]}
    assert sliced == {"out": None, "scores": {"output": "out", "axis": 1, "start": 4, "stop": 10},
                      "out.axis1.0-4": {"output": "out", "axis": 1, "start": 0, "stop": 4}}
    markdown = (out / "report.md").read_text()
    assert "| int8-static | scores: out[axis 1: 4:10] |" in markdown
    assert "- `int8-static` fidelity.scores.cosine: cosine to baseline of out[axis 1: 4:10]" in markdown
    assert "fidelity.scores.cosine" in result.stdout  # the gate table names it
    assert "(cosine to baseline of out[axis 1: 4:10] 0 < 0.99)" in " ".join(result.stdout.split())  # not markup


def test_slices_and_relative_error_on_an_edited_copy_with_real_sessions(tmp_path):
    import onnxruntime as ort

    mixed_model(tmp_path / "base.onnx")
    mixed_model(tmp_path / "edited.onnx", flip_scores=True)
    x = {"x": np.random.default_rng(2).random((32, 4), dtype=np.float32)}
    base, edited = ({"out": ort.InferenceSession(str(tmp_path / name)).run(None, x)[0]}
                    for name in ("base.onnx", "edited.onnx"))
    spec = ValidateSpec(fidelity=FidelityGate(cosine_min=0.99, rel_l2_max=0.2, rows=False, slices=[SCORES]))
    comparisons = compare_outputs(base, edited, spec)
    verdicts = {g.name: g.passed for g in fidelity_gates(comparisons, spec)}
    assert verdicts == {"fidelity.out.finite": True, "fidelity.out.cosine": True, "fidelity.out.rel_l2": True,
                        "fidelity.scores.cosine": False}
    assert compare_outputs(base, base, spec)[1].rel_l2 == 0.0


@pytest.mark.parametrize(("part", "key", "fragment"), [
    ({"stop": 11}, "stop", "stop 11 is past axis 1 of output 'out', which has 10"),
    ({"start": 10, "stop": None}, "start", "start 10 is past axis 1 of output 'out', which has 10"),
    ({"axis": 2}, "axis", "output 'out' has 2 axes"),
    ({"output": "logits"}, "output", "'logits' is not an output of the baseline; its outputs: out"),
    ({"name": "out"}, "name", "'out' is already an output's name"),
])
def test_check_refuses_a_slice_that_does_not_fit_the_baseline(temper, tmp_path, part, key, fragment):
    recipe = _recipe(tmp_path, {"slices": [{"output": "out", "axis": 1, "start": 0, "stop": 4, "cosine_min": 0.9},
                                           {**SCORES, **part}]})
    for command in ("check", "run"):
        result = temper(command, recipe, *(["--output", tmp_path / "out"] if command == "run" else []))
        assert result.code == 2, (result.code, result.stderr)
        line = result.stderr.strip()
        assert "\n" not in line and line.startswith(f"error: {recipe}: validate.fidelity.slices[1].{key}: "), line
        assert fragment in line, line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("part", "key", "fragment"), [
    ({"stop": 4}, "validate.fidelity.slices[0]", "stop 4 is not past start 4"),
    ({"cosine_min": None}, "validate.fidelity.slices[0]", "a slice needs a bound to gate on"),
])
def test_a_slice_without_extent_or_bound_is_bad_input(temper, tmp_path, part, key, fragment):
    recipe = _recipe(tmp_path, {"slices": [{**SCORES, **part}]})
    result = temper("check", recipe)
    assert result.code == 2 and result.stderr.strip().startswith(f"error: {recipe}: {key}: "), result.stderr
    assert fragment in result.stderr


def test_two_slices_with_one_name_are_bad_input(temper, tmp_path):
    recipe = _recipe(tmp_path, {"slices": [SCORES, {**SCORES, "start": 5}]})
    result = temper("check", recipe)
    assert result.code == 2 and "two slices are named 'scores'" in result.stderr, result.stderr
    assert result.stderr.strip().startswith(f"error: {recipe}: validate.fidelity: ")
