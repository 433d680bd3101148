"""The default fidelity gate on a mixed-scale output (issue 33.1): a detector-like output [batch, 22] holding 4
box rows in the hundreds beside 18 class-score rows in [0, 1]. Its static INT8 model (one per-tensor scale over
both parts) keeps the boxes and ruins the scores, with a whole-output cosine above 0.999; with the recipe a
user writes first (`cosine_min: 0.99`, no slices) the worst row's gate must fail it, and `temper check` must
name the output and suggest the slice."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import yaml
from onnx import TensorProto, helper, numpy_helper

from tests.unit.reports import read_report

BOXES, CLASSES = 4, 18


def mixed_model(path: Path) -> None:
    """out = concat(x @ wb (hundreds of pixels), sigmoid(x @ ws) (0..1)): [batch, 4 + 18]."""
    rng = np.random.default_rng(0)
    wb = (rng.random((4, BOXES)) * 300).astype(np.float32)
    ws = rng.normal(size=(4, CLASSES)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "wb"], ["boxes"], name="box"),
             helper.make_node("MatMul", ["x", "ws"], ["logit"], name="score"),
             helper.make_node("Sigmoid", ["logit"], ["scores"], name="sigmoid"),
             helper.make_node("Concat", ["boxes", "scores"], ["out"], axis=1, name="concat")]
    graph = helper.make_graph(nodes, "mixed", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", BOXES + CLASSES])],
                              [numpy_helper.from_array(wb, "wb"), numpy_helper.from_array(ws, "ws")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def mixed_recipe(folder: Path, fidelity: dict | None = None, **extra: object) -> Path:
    mixed_model(folder / "mixed.onnx")
    rng = np.random.default_rng(1)
    np.savez(folder / "calib.npz", x=rng.random((64, 4), dtype=np.float32))
    np.savez(folder / "eval.npz", x=rng.random((64, 4), dtype=np.float32))
    recipe = folder / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({
        "version": 1, "name": "mixed",
        "model": {"onnx": "mixed.onnx", "inputs": [{"name": "x", "shape": ["batch", 4]}], "outputs": ["out"]},
        "data": {"calibration": {"path": "calib.npz", "batch_size": 16},
                 "evaluation": {"path": "eval.npz", "batch_size": 16}},
        "candidates": {"int8-static": {"steps": [{"quantize": {"mode": "static", "format": "qdq"}}]}},
        "validate": {"fidelity": fidelity or {"cosine_min": 0.99}}, **extra}, sort_keys=False))
    return recipe


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
