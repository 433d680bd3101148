"""A green run must not hide a candidate that did not build: user paths are absolute before any step
runs (static INT8 works inside another working folder), and a build that raised is named in the
summary, report.json, report.md and junit.xml and fails a gated run (exit 1) unless allowed."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper

from tests.helpers import edit_recipe
from tests.unit.reports import read_report


@pytest.mark.slow
@pytest.mark.parametrize("how", ["flag", "env"])
def test_a_relative_cache_folder_still_builds_static_int8(temper, digits_dir, monkeypatch, how):
    recipe = digits_dir / "digits-cnn.yaml"
    edit_recipe(recipe, lambda d: ([d.pop(k) for k in ("validate", "select", "publish")],
                                   d.update(candidates={"int8-static": d["candidates"]["int8-static"]})))
    monkeypatch.chdir(digits_dir)
    args = ["run", "digits-cnn.yaml", "--output", "out"]
    if how == "flag":
        args += ["--cache-dir", "relcache"]
    else:
        monkeypatch.setenv("TEMPER_CACHE_DIR", "relcache")
    result = temper(*args)
    assert result.code == 0, result.stderr
    manifest = json.loads((digits_dir / "out" / "manifest.json").read_text())
    assert manifest["candidates"]["int8-static"]["status"] == "ok", manifest["candidates"]
    ops = {n.op_type for n in onnx.load(str(digits_dir / "out" / "int8-static" / "model.onnx")).graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    stored = [json.loads(p.read_text())["step"] for p in (digits_dir / "relcache").glob("*/*/meta.json")]
    assert sorted(stored) == ["export", "quantize", "simplify"]  # the cache is where the user said, under the cwd


def test_relative_tracking_stores_are_made_absolute_where_they_enter(tmp_path, monkeypatch):
    from temper.pipeline.cli.common import absolute_store

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    assert absolute_store("sqlite:///mlflow.db") == f"sqlite:///{tmp_path.resolve() / 'mlflow.db'}"
    assert absolute_store("mlruns") == (tmp_path.resolve() / "mlruns").as_uri()
    assert absolute_store("file:mlruns") == (tmp_path.resolve() / "mlruns").as_uri()
    for kept in ("sqlite:////abs/m.db", "http://127.0.0.1:5000", "databricks", "file:///abs/mlruns"):
        assert absolute_store(kept) == kept
    assert absolute_store(None) is None  # the registry's own default
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///env.db")
    assert absolute_store(None) == f"sqlite:///{tmp_path.resolve() / 'env.db'}"


def _tiny(folder: Path, candidates: dict, evaluation: np.ndarray | None = None) -> Path:
    weight = numpy_helper.from_array(np.random.default_rng(0).random((4, 3), dtype=np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="matmul_0")], "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])], [weight])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(folder / "tiny.onnx"))
    rows = evaluation if evaluation is not None else np.random.default_rng(1).random((32, 4), dtype=np.float32)
    np.savez(folder / "eval.npz", x=rows)
    recipe = folder / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({
        "version": 1, "name": "tiny",
        "model": {"onnx": "tiny.onnx", "inputs": [{"name": "x", "shape": ["batch", 4]}], "outputs": ["y"]},
        "data": {"evaluation": {"path": "eval.npz", "batch_size": 16}},
        "candidates": candidates, "validate": {"fidelity": {"cosine_min": 0.9}}}, sort_keys=False))
    return recipe


def _damage_cached(cache: Path, step: str) -> None:
    """A cache entry damaged on disk (a full disk, another tool): the environment's fault, not the candidate's."""
    (meta,) = [m for m in cache.glob("*/*/meta.json") if json.loads(m.read_text())["step"] == step]
    (meta.parent / "model.onnx").write_bytes(b"not an onnx model")


def test_a_build_error_is_named_everywhere_and_fails_the_gated_run(temper, tmp_path, isolated_cache):
    recipe = _tiny(tmp_path, {"ok": {"steps": [{"quantize": {"mode": "dynamic"}}]},
                              "broken": {"steps": [{"fix_shapes": {"dims": {"batch": 16}}},
                                                   {"quantize": {"mode": "dynamic"}}]}})
    assert temper("run", recipe, "--output", tmp_path / "first").code == 0
    _damage_cached(isolated_cache, "fix_shapes")

    out = tmp_path / "out"
    result = temper("run", recipe, "--output", out)
    assert result.code == 1, result.stderr
    summary = next(line for line in result.stdout.splitlines() if "broken" in line)
    assert "build error" in summary
    (line,) = [x for x in result.stderr.splitlines() if "candidate broken" in x]
    assert line.startswith("error: candidate broken did not build: quantize: ") and "not a gate: exit 1" in line
    report = read_report(out)
    assert report["candidates"]["ok"]["passed"] is True  # the others are still gated
    # and selected by the rule: with no speed measured nothing shows `ok` beats the baseline
    assert report["selected"] == "baseline" and "speed was not measured" in report["selection_reason"]
    assert list(report["not_built"]) == ["broken"] and report["not_built"]["broken"]["kind"] == "error"
    assert report["not_built"]["broken"]["reason"].startswith("quantize: ")
    assert [g["passed"] for g in report["candidates"]["broken"]["gates"] if g["name"] == "build"] == [False]
    markdown = (out / "report.md").read_text()
    assert "- `broken` did not build, **build error**" in markdown
    suite = ET.parse(out / "junit.xml").getroot()
    assert suite.get("errors") == "1" and suite.find(".//testcase[@classname='tiny.broken']/error") is not None

    again = temper("validate", recipe, "--output", out)  # re-gating the folder keeps the error in sight
    assert again.code == 1, again.stderr
    assert "error: candidate broken did not build: quantize: " in again.stderr
    assert read_report(out)["not_built"]["broken"]["kind"] == "error"

    allowed = temper("run", recipe, "--output", tmp_path / "allowed", "--allow-build-errors")
    assert allowed.code == 0, allowed.stderr
    (line,) = [x for x in allowed.stderr.splitlines() if "candidate broken" in x]
    assert line.startswith("warning: candidate broken did not build") and "--allow-build-errors" in line
    assert read_report(tmp_path / "allowed")["not_built"]["broken"]["kind"] == "error"


def test_a_build_its_step_rejects_is_a_failed_gate_and_the_run_exits_0(temper, tmp_path):
    huge = np.full((32, 4), 1e6, dtype=np.float32)  # past float16's range: the fp16 step refuses its model
    recipe = _tiny(tmp_path, {"ok": {"steps": [{"quantize": {"mode": "dynamic"}}]},
                              "fp16": {"steps": [{"fp16": {"keep_io_types": False}}]}}, evaluation=huge)
    out = tmp_path / "out"
    result = temper("run", recipe, "--output", out)
    assert result.code == 0, result.stderr
    (line,) = [x for x in result.stderr.splitlines() if "candidate fp16" in x]
    assert line.startswith("rejected: candidate fp16 did not build: fp16: ") and "build gate fails" in line
    report = read_report(out)
    assert report["not_built"] == {"fp16": {"kind": "rejected", "reason": report["not_built"]["fp16"]["reason"]}}
    assert "float16" in report["not_built"]["fp16"]["reason"]
    assert ET.parse(out / "junit.xml").getroot().get("errors") == "0"


def test_a_baseline_that_cannot_be_built_exits_1_from_check_and_run_with_one_line(temper, tmp_path):
    """A shared step failing leaves nothing to gate: `temper check` and `temper run` say the same line, naming the
    step's key, and exit 1 (a build that failed, README's table), with no output folder written. Here onnxsim
    fails inside an If branch on an op ONNX Runtime has no kernel for."""
    recipe = _tiny(tmp_path, {"int8": {"steps": [{"quantize": {"mode": "dynamic"}}]}})
    weight = numpy_helper.from_array(np.random.default_rng(0).random((4, 3), dtype=np.float32), "w")

    def branch(name: str, last: onnx.NodeProto) -> onnx.GraphProto:
        return helper.make_graph([helper.make_node("MatMul", ["x", "w"], [f"{name}_h"]), last], name, [],
                                 [helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, ["batch", 3])])

    custom = helper.make_node("Frobnicate", ["then_h"], ["then_y"], domain="acme", name="then_custom")
    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0), helper.make_node("Greater", ["s", "zero"], ["c"]),
         helper.make_node("If", ["c"], ["y"], name="branch", then_branch=branch("then", custom),
                          else_branch=branch("else", helper.make_node("Relu", ["else_h"], ["else_y"])))], "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
        [weight, numpy_helper.from_array(np.array(0.0, np.float32), "zero")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("acme", 1)])
    onnx.save(model, str(tmp_path / "tiny.onnx"))
    edit_recipe(recipe, lambda d: d.update(steps=["simplify"]))

    checked, ran = temper("check", recipe), temper("run", recipe, "--output", tmp_path / "out")
    lines = []
    for result in (checked, ran):
        assert result.code == 1, result.stderr
        (line,) = [x for x in result.stderr.splitlines() if x.startswith("error:")]
        lines.append(line)
    assert lines[0] == lines[1]
    assert lines[0].startswith(f"error: {recipe}: steps[0].simplify: the baseline cannot be built: simplify: "
                               "onnx-simplifier failed: "), lines[0]
    assert "Node (branch) Op (If)" in lines[0]  # the node, and the way out with its cost
    assert lines[0].endswith("remove this simplify step (the cost: the model keeps the constants and redundant nodes "
                             "onnxsim would fold; ONNX Runtime folds most of them itself when it loads the model)")
    assert "Traceback" not in checked.stderr + ran.stderr and not (tmp_path / "out").exists()
