"""The gates measure fidelity the way the server batches (issue 37.1): each probe row alone and inside batches
of other rows, the worst composition gated, and a candidate whose answers move with the rows beside it marked
batch-dependent in report.json and in the runtime.json its bundle serves with. Through the console script."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.artifacts.composition_models import matmul_model, rows
from tests.unit.reports import read_report

TEMPER = Path(sys.executable).with_name("temper")  # the console script installed beside this interpreter


def temper(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(TEMPER), *map(str, args)], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ))


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str], dict]:
    folder = tmp_path_factory.mktemp("composition")
    matmul_model(folder / "loud.onnx")
    # the loud rows come last, all in the last evaluation batch: fixed evaluation batches never put a quiet
    # row beside a loud one, so the plain fidelity gate sees dynamic INT8 at its best
    np.savez(folder / "eval.npz", x=rows(64, loud_last=8), label=np.zeros(64, dtype=np.int64))
    np.savez(folder / "calib.npz", x=rows(64, loud_last=8, seed=1), label=np.zeros(64, dtype=np.int64))
    recipe = {
        "version": 1, "name": "loud",
        "model": {"onnx": "loud.onnx", "inputs": [{"name": "x", "shape": ["batch", 16]}], "outputs": ["y"]},
        "data": {"calibration": {"path": "calib.npz", "label": "label", "batch_size": 8},
                 "evaluation": {"path": "eval.npz", "label": "label", "batch_size": 8}},
        "candidates": {"int8-dynamic": {"steps": [{"quantize": {"mode": "dynamic"}}]},
                       "fp16": {"steps": [{"fp16": {"keep_io_types": True}}]}},
        "validate": {"fidelity": {"cosine_min": 0.999}},
    }
    (folder / "recipe.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    result = temper("run", folder / "recipe.yaml", "--output", folder / "out")
    return folder, result, read_report(folder / "out")


def _gates(entry: dict) -> dict[str, bool]:
    return {g["name"]: g["passed"] for g in entry["gates"]}


def test_a_candidate_whose_answer_moves_with_its_batch_fails_the_batched_gate_and_is_marked(run):
    _, result, report = run
    assert result.returncode == 0, result.stderr
    dynamic = report["candidates"]["int8-dynamic"]
    gates = _gates(dynamic)
    assert gates["fidelity.y.cosine"], dynamic["gates"]  # fixed evaluation batches: it looks faithful
    assert gates["fidelity.batched.y.cosine"] is False, dynamic["gates"]  # beside loud rows it is not
    composition = dynamic["batch_composition"]
    assert composition["dependent"] and composition["worst"] == "loudest" and composition["batch_size"] == 16
    figures = {c["name"]: c for c in composition["compositions"]}
    assert figures["alone"]["rel_l2_to_alone_max"] == 0.0 and figures["alone"]["cosine_to_baseline"] > 0.999
    assert figures["loudest"]["cosine_to_alone_min"] < 0.99 and figures["loudest"]["row_cosine_to_baseline_min"] < 0.999
    detail = next(g["detail"] for g in dynamic["gates"] if g["name"] == "fidelity.batched.y.cosine")
    assert "worst batch composition 'loudest'" in detail
    assert not dynamic["passed"]


def test_row_independent_models_are_not_marked(run):
    _, _, report = run
    assert report["baseline"]["batch_composition"]["dependent"] is False
    fp16 = report["candidates"]["fp16"]
    assert fp16["batch_composition"]["dependent"] is False and fp16["passed"], fp16["gates"]
    assert all(passed for name, passed in _gates(fp16).items() if name.startswith("fidelity.batched."))
    for figure in fp16["batch_composition"]["compositions"]:
        assert figure["rel_l2_to_alone_max"] <= fp16["batch_composition"]["dependent_above"]


def test_the_runtime_json_of_a_dependent_candidate_says_so(run, tmp_path):
    folder, _, _ = run
    for candidate, dependent in (("int8-dynamic", True), ("fp16", False)):
        dest = tmp_path / candidate
        exported = temper("export-triton", folder / "out" / candidate, "--dest", dest)
        assert exported.returncode == 0, exported.stderr
        (config,) = dest.glob("*/1/runtime.json")
        assert json.loads(config.read_text())["batch_dependent"] is dependent
