"""What a fallback that missed its budget says of its search (issue 33.5), through the console script: the
trials max_trials counted, with the configuration rounds beside them (report.md counted a configuration's model
among the trials on one side only: "13 of at most 12 trials"), and what stopped it: the floor says so, where the
summary always said "raise fallback.max_trials" though more trials could not have helped."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
from onnx import helper

from tests.helpers import save_graph, write_recipe
from tests.pipeline.test_console_log import temper


def normalized(path: Path) -> None:
    """x[batch, 16] -> MatMul with weight columns over four orders of magnitude -> Div by each column's scale:
    one weight scale per tensor loses the small columns, which the Div makes as large as the others, so
    per-channel scales lower the MSE and the fallback keeps that configuration's model as a trial of its own."""
    rng = np.random.default_rng(0)
    scale = np.logspace(-3, 1, 16).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="fc"),
             helper.make_node("Div", ["h", "s"], ["y"], name="norm")]
    weights = {"w": (rng.normal(0, 0.3, (16, 16)) * scale).astype(np.float32), "s": scale}
    save_graph(path, nodes, {"x": ["batch", 16]}, {"y": ["batch", 16]}, weights, name="norm")


def run(folder: Path, max_trials: int) -> tuple[str, dict, str]:
    """The model with an MSE budget of 0 (every INT8 trial misses), per-tensor weights in the step."""
    normalized(folder / "norm.onnx")
    rng = np.random.default_rng(1)
    calibration, evaluation = (rng.normal(0, 1, (32, 16)).astype(np.float32) for _ in range(2))
    model = {"onnx": "norm.onnx", "inputs": [{"name": "x", "shape": ["batch", 16]}], "outputs": ["y"]}
    quantize = {"mode": "static", "per_channel": False, "fallback": {"max_trials": max_trials}}
    recipe = write_recipe(folder, "norm", model, {"x": calibration}, {"int8": {"steps": [{"quantize": quantize}]}},
                          {"accuracy": {"metric": "mse", "max_drop": 0.0}}, evaluation={"x": evaluation})
    result = temper("run", recipe, "--output", folder / "out", "--cache-dir", folder / "cache")
    assert result.returncode == 0, result.stderr
    tuning = json.loads((folder / "out" / "int8" / "tuning.json").read_text())
    assert not tuning["met"] and [t["kind"] for t in tuning["trials"]][:2] == ["plain", "configuration"], tuning
    return " ".join(result.stderr.split()), tuning, " ".join((folder / "out" / "report.md").read_text().split())


def test_trials_are_counted_as_max_trials_counts_them(tmp_path):
    stderr, tuning, markdown = run(tmp_path, max_trials=1)
    rounds = len(tuning["configurations"])
    assert len(tuning["trials"]) == 2 and rounds == 2, tuning  # the plain model and a configuration's
    assert "1 of at most 1 trial and 2 configuration rounds; kept: trial 1" in markdown, markdown
    assert re.search(r"\b2 of at most 1 trials?\b", markdown) is None
    assert "int8 missed the budget after 1 trial and 2 configuration rounds:" in stderr, stderr
    assert "Stopped: it spent fallback.max_trials; raise fallback.max_trials or the budget." in stderr, stderr
    assert "stopped: it spent fallback.max_trials" in markdown


def test_a_search_the_floor_stopped_says_so_not_raise_max_trials(tmp_path):
    stderr, tuning, markdown = run(tmp_path, max_trials=12)
    assert tuning["floor_reached"] and tuning["floor"] == 1, tuning
    assert "Stopped: it reached the floor of 1 quantized node (fallback.min_quantized 0.5 " in stderr, stderr
    assert "lower fallback.min_quantized or raise the budget" in stderr
    assert "max_trials" not in stderr, stderr
    assert "stopped: it reached the floor of 1 quantized node (" in markdown
