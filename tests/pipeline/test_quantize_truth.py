"""A candidate called INT8 is INT8: a quantize step that quantized nothing fails its build, a label the
graph contradicts fails the precision gate, and a fallback that could meet its budget only by leaving
INT8 fails its gate; real models, through the console script and the step itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.helpers import edit_recipe
from tests.pipeline.steps.quantize_models import if_model
from tests.unit.reports import read_report

TEMPER = Path(sys.executable).with_name("temper")  # the console script installed beside this interpreter


def temper(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(TEMPER), *map(str, args)], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ))


def branchy_recipe(folder: Path, candidates: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    if_model(folder / "branchy.onnx")
    rng = np.random.default_rng(1)
    for name, rows in (("calib", 64), ("eval", 64)):
        np.savez(folder / f"{name}.npz", x=rng.normal(0, 1, (rows, 16)).astype(np.float32),
                 label=rng.integers(0, 4, rows))
    recipe = {
        "version": 1, "name": "branchy",
        "model": {"onnx": "branchy.onnx", "inputs": [{"name": "x", "shape": ["batch", 16]}], "outputs": ["y"]},
        "data": {"calibration": {"path": "calib.npz", "label": "label", "batch_size": 16},
                 "evaluation": {"path": "eval.npz", "label": "label", "batch_size": 16}},
        "candidates": candidates,
        "validate": {"accuracy": {"metric": "top1", "max_drop": 0.05}},
    }
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


CANDIDATES = {
    "int8-dynamic": {"steps": [{"quantize": {"mode": "dynamic"}}]},
    "int8-static": {"steps": [{"quantize": {"mode": "static"}}]},
    "int8-fallback": {"steps": [{"quantize": {"mode": "static", "fallback": {"max_trials": 3}}}]},
    "fp16": {"steps": ["fp16"]},
    # every op kept in FP32: the fp16 step writes an FP32 graph (with Casts at most)
    "fp16-in-name": {"steps": [{"fp16": {"op_block_list": ["MatMul", "Relu", "ReduceSum", "Greater", "If"]}}]},
}


@pytest.fixture(scope="module")
def branchy_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], dict]:
    folder = tmp_path_factory.mktemp("branchy")
    recipe = branchy_recipe(folder / "recipe", CANDIDATES)
    result = temper("run", recipe, "--output", folder / "out")
    return result, read_report(folder / "out")


@pytest.mark.slow
def test_a_quantize_step_that_quantized_nothing_fails_its_build_and_the_run_goes_on(branchy_run):
    result, report = branchy_run
    assert result.returncode == 0, result.stderr  # a build its own check refuses is a failed gate, not an error
    fp16 = report["candidates"]["fp16"]
    assert fp16["passed"] and fp16["precision"] == "fp16"  # the run goes on: fp16 is built and gated
    # no throughput measured, so nothing shows fp16 faster: the baseline is selected, saying so
    assert report["selected"] == "baseline" and "speed was not measured" in report["selection_reason"]
    expected = ("quantize wrote no quantized node (0 of 4 eligible; 4 are inside If/Loop/Scan subgraphs, "
                "which ONNX Runtime's quantizer leaves alone)")
    for name, mode in (("int8-dynamic", "dynamic"), ("int8-static", "static"), ("int8-fallback", "static")):
        entry = report["candidates"][name]
        assert [(g["name"], g["passed"]) for g in entry["gates"]] == [("build", False)], entry["gates"]
        assert entry["gates"][0]["detail"].startswith(expected), entry["gates"][0]["detail"]
        assert entry["precision"] is None and entry["intended_precision"] == f"int8-{mode}"
        assert entry["census"] is None and entry["tuning"] is None
        assert f"rejected: candidate {name} did not build: {expected}" in result.stderr
    assert "Traceback" not in result.stderr


def test_check_says_for_each_quantize_step_how_much_compute_subgraphs_keep_in_float(tmp_path):
    recipe = branchy_recipe(tmp_path / "recipe", CANDIDATES)
    result = temper("check", recipe)
    assert result.returncode == 0, result.stderr  # a notice, not an error: the run would still gate fp16
    notices = [line.strip() for line in result.stdout.splitlines() if line.strip().startswith("! ")]
    said = ("4 of 4 compute nodes are inside If/Loop/Scan subgraphs, which ONNX Runtime's quantizer leaves in float: "
            "this step will quantize nothing and its candidate will be rejected")
    assert notices == [f"! candidates.{name}.steps[0].quantize: {said}"
                       for name in ("int8-dynamic", "int8-static", "int8-fallback")], result.stdout


def test_the_notice_counts_the_compute_outside_subgraphs_too(tmp_path):
    from temper.pipeline.steps.quantize.census_check import subgraph_notice
    from temper.validators.census import of_file
    from tests.pipeline.steps.quantize_models import conv_net

    assert subgraph_notice(of_file(conv_net(tmp_path / "net.onnx")), "ONNX Runtime's quantizer") is None
    assert subgraph_notice(of_file(if_model(tmp_path / "mixed.onnx", head=True)), "ModelOpt") == (
        "4 of 5 compute nodes are inside If/Loop/Scan subgraphs, which ModelOpt leaves in float: "
        "only the other 1 can become INT8")


def test_a_label_the_graph_contradicts_is_the_graphs_and_fails_the_precision_gate(branchy_run):
    _, report = branchy_run
    entry = report["candidates"]["fp16-in-name"]
    assert entry["precision"] == "fp32" and entry["intended_precision"] == "fp16"
    census = entry["census"]
    assert (census["eligible"], census["fp16"], census["fp32"], census["in_subgraphs"]) == (4, 0, 4, 4)
    gate = next(g for g in entry["gates"] if g["name"] == "precision")
    assert not gate["passed"] and not entry["passed"]
    assert gate["detail"].startswith("the recipe's steps make fp16, but the graph is fp32: 4 eligible nodes")
    honest = report["candidates"]["fp16"]
    assert honest["census"]["fp16"] == 4 and all(g["name"] != "precision" for g in honest["gates"])


def test_every_op_type_excluded_fails_the_build_with_what_to_do(tmp_path):
    from temper.artifacts.core.errors import StepFailed
    from tests.pipeline.steps.quantize_models import conv_net, quantize

    src = conv_net(tmp_path / "net.onnx")
    with pytest.raises(StepFailed, match=r"^quantize wrote no quantized node \(0 of 3 eligible\): exclude fewer"):
        quantize(src, tmp_path, mode="dynamic", exclude_op_types=["Conv", "MatMul"])
    assert quantize(src, tmp_path, mode="dynamic", exclude_op_types=["Conv"]) is not None  # MatMul left: INT8


def test_modelopt_that_quantized_nothing_fails_its_build_too(tmp_path):
    pytest.importorskip("modelopt.onnx.quantization", reason="backend: modelopt is an optional extra")
    from temper.artifacts.core.errors import StepFailed
    from temper.pipeline.quantize_backends import ModelOptOptions
    from temper.pipeline.steps.base import StepContext
    from temper.pipeline.steps.quantize import Quantize

    src = if_model(tmp_path / "branchy.onnx")
    batches = [{"x": np.random.default_rng(s).normal(0, 1, (8, 16)).astype(np.float32)} for s in range(4)]
    (tmp_path / "scratch").mkdir()
    ctx = StepContext([], lambda: batches, lambda: batches[0], tmp_path / "scratch")
    with pytest.raises(StepFailed, match=r"^quantize wrote no quantized node \(0 of 4 eligible; 4 are inside"):
        Quantize().run(src, tmp_path / "q.onnx", ModelOptOptions(mode="static", backend="modelopt", preset=None), ctx)


# -- the fallback's floor, on digits -------------------------------------------------------------------


def _all_float_budget(recipe: Path, **fallback: object) -> None:
    """Static INT8 aiming at mse with no drop allowed: only the model with every node back in float holds it."""
    def change(d: dict) -> None:
        d["validate"]["accuracy"] = {"metric": "mse", "max_drop": 0.0}
        del d["validate"]["throughput"]
        d["candidates"] = {"int8-static": {"steps": [{"quantize": {"mode": "static", "fallback": fallback}}]}}
        del d["publish"]

    edit_recipe(recipe, change)


@pytest.mark.slow
def test_a_budget_met_only_in_float_is_not_reachable_in_int8_and_fails(temper, gated_digits, tmp_path):
    _all_float_budget(gated_digits, max_trials=12)
    out = tmp_path / "out"
    result = temper("run", gated_digits, "--output", out)
    report = read_report(out)
    entry = report["candidates"]["int8-static"]
    tuning = entry["tuning"]
    plain = tuning["trials"][0]["quantized"]
    assert plain == entry["census"]["eligible"] > 0 and tuning["min_quantized"] == 0.5
    assert tuning["floor"] == -(-plain // 2) and tuning["floor_reached"] and not tuning["met"]
    assert all(t["quantized"] >= tuning["floor"] for t in tuning["trials"])  # below the floor: never scored
    kept = tuning["trials"][tuning["best"]]
    assert entry["census"]["quantized"] == kept["quantized"] and entry["precision"] == "int8-static"
    gate = next(g for g in entry["gates"] if g["name"] == "fallback")
    assert not gate["passed"] and gate["detail"].startswith("budget not reachable in INT8")
    assert (gate["measured"], gate["budget"]) == (kept["quantized"], tuning["floor"])
    assert not entry["passed"] and report["selected"] == "baseline" and result.code == 0
    assert "budget not reachable in INT8" in (out / "report.md").read_text()


@pytest.mark.parametrize("value", [0, 1.5, -0.1])
def test_min_quantized_outside_a_fraction_is_bad_input(temper, digits_dir, value):
    recipe = digits_dir / "digits-cnn.yaml"
    edit_recipe(recipe, lambda d: d["candidates"]["int8-static"]["steps"][0]["quantize"].update(
        fallback={"min_quantized": value}))
    result = temper("check", recipe)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.code == 2 and len(lines) == 1, result.stderr
    key = "candidates.int8-static.steps[0].quantize.fallback.min_quantized"
    assert lines[0].startswith(f"error: {recipe}: {key}: ") and "fraction above 0 and at most 1" in lines[0], lines


class _Notes:
    """An observer keeping what the runner and the steps say while they work."""

    def __init__(self) -> None:
        self.notes: list[str] = []

    def started(self, chain: str, step: str) -> None: ...

    def finished(self, chain: str, record: object) -> None: ...

    def note(self, text: str) -> None:
        self.notes.append(text)

    def logged(self, text: str) -> None:  # a finished piece (a trial scored): a line of its own in a CI log
        self.notes.append(text)


@pytest.mark.slow
def test_the_fallback_reports_each_trial_through_the_observer(gated_digits, tmp_path):
    from temper.pipeline.cli.common import step_cache
    from temper.pipeline.loading import load_recipe
    from temper.pipeline.runner import Runner

    _all_float_budget(gated_digits, max_trials=3)
    observer = _Notes()
    with Runner(load_recipe(gated_digits), step_cache(tmp_path / "cache"), observer) as runner:
        result = runner.run()
    assert result.ok
    tuning = json.loads((result.candidates[0].model.path.parent / "tuning.json").read_text())
    trials = [n for n in observer.notes if "fallback trial" in n and "drop" in n]
    counted = [t for t in tuning["trials"] if t["kind"] != "configuration"]  # configuration rounds: beside them
    assert len(trials) == len(counted) == 3
    assert any(n.startswith("int8-static › quantize › fallback: configuration ") and "calibration: percentile: " in n
               for n in observer.notes)  # digits' step has minmax: percentile is tried before any node goes float
    first = tuning["trials"][0]
    assert trials[0] == (f"int8-static › quantize › fallback trial 1 of 3: 0 nodes in float, {first['quantized']} "
                         f"quantized nodes left, mse drop {first['drop']:.4f} (misses 0.0000)")
    assert any(n.startswith("int8-static › quantize › fallback: ranking nodes by SQNR") for n in observer.notes)
