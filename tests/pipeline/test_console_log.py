"""What a CI log shows (issue 33.4), through the console script with stderr a pipe, as in CI: progress on a
terminal is one transient line, so without these lines a long fallback and minutes of pair timing print
nothing. Each fallback trial and each (pair, batch size) timed is a line of its own with the time since the
command began; ONNX Runtime's `[E:onnxruntime]` lines and onnx-simplifier's own prints stay out unless --debug."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper

from tests.helpers import write_recipe
from tests.pipeline.steps.quantize_models import rate_model

TEMPER = Path(sys.executable).with_name("temper")  # the console script installed beside this interpreter
STAMP = r"  \d+:\d\d:\d\d$"  # the time since the command began, at the end of each logged line


def temper(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(TEMPER), *map(str, args)], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ))


def mlp(path: Path) -> None:
    """x[batch, 16] -> MatMul fc1 -> Relu -> MatMul fc2 -> y[batch, 4]."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w2"], ["y"], name="fc2")]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
                              [numpy_helper.from_array(rng.normal(0, 0.3, (16, 16)).astype(np.float32), "w1"),
                               numpy_helper.from_array(rng.normal(0, 0.3, (16, 4)).astype(np.float32), "w2")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def test_a_ci_log_has_a_line_per_fallback_trial_and_per_pair_and_batch_size(tmp_path):
    mlp(tmp_path / "mlp.onnx")
    rng = np.random.default_rng(1)
    for name in ("calib", "eval"):
        np.savez(tmp_path / f"{name}.npz", x=rng.normal(0, 1, (32, 16)).astype(np.float32),
                 label=rng.integers(0, 4, 32))
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({
        "version": 1, "name": "mlp",
        "model": {"onnx": "mlp.onnx", "inputs": [{"name": "x", "shape": ["batch", 16]}], "outputs": ["y"]},
        "data": {"calibration": {"path": "calib.npz", "label": "label", "batch_size": 16},
                 "evaluation": {"path": "eval.npz", "label": "label", "batch_size": 16}},
        # a cosine INT8 cannot reach: every trial misses, so the fallback spends its trials
        "candidates": {"int8": {"steps": [{"quantize": {"mode": "static", "fallback": {"max_trials": 2}}}]}},
        "validate": {"accuracy": {"metric": "top1", "max_drop": 0.5}, "fidelity": {"cosine_min": 0.9999999},
                     "throughput": {"batch_sizes": [1, 4], "duration_s": 0.2, "warmup_s": 0}},
    }, sort_keys=False))
    result = temper("run", recipe, "--output", tmp_path / "out", "--cache-dir", tmp_path / "cache")
    assert result.returncode == 0, result.stderr
    logged = [line for line in result.stderr.splitlines() if line.startswith("  · ")]
    trials = [line for line in logged if "› fallback trial " in line]
    assert [re.search(r"fallback trial (\d) of 2", line).group(1) for line in trials] == ["1", "2"], logged
    assert all(re.search(r"drop \d\.\d{4} \(misses 0\.5000\)" + STAMP, line) for line in trials), trials
    assert trials[0].startswith("  · int8 › quantize › fallback trial 1 of 2: 0 nodes in float, "), trials
    timed = [line for line in logged if line.startswith("  · throughput › batch ")]
    assert len(timed) == 4, logged  # two pairs (the baseline and int8) at two batch sizes
    for size in (1, 4):
        assert any(re.match(rf"  · throughput › batch {size}: baseline [\d,]+ samples/s \(the reference, \d+ "
                            rf"rounds\){STAMP}", line) for line in timed), timed
        assert any(re.match(rf"  · throughput › batch {size}: int8 [\d,]+ samples/s, \d+\.\d\dx \[\d+\.\d\d, "
                            rf"\d+\.\d\d\] over baseline \(\d+ rounds\){STAMP}", line) for line in timed), timed


def rate_recipe(folder: Path, steps: list, rate: int = 16000, candidates: dict | None = None) -> Path:
    """rate_model with its sample rate the constant `rate` (`value: 16000`, as Silero's recipe has it)."""
    rate_model(folder / "rate.onnx")
    rng = np.random.default_rng(2)
    calibration, evaluation = (rng.normal(0, 1, (32, 16)).astype(np.float32) for _ in range(2))
    model = {"onnx": "rate.onnx", "outputs": ["y"],
             "inputs": [{"name": "x", "shape": ["batch", 16]},
                        {"name": "sr", "dtype": "int64", "shape": [], "value": rate}]}
    return write_recipe(folder, "rate", model, {"x": calibration}, candidates or {"fp16": {"steps": ["fp16"]}},
                        {"fidelity": {"cosine_min": 0.99}}, evaluation={"x": evaluation}, steps=steps)


@pytest.mark.parametrize("debug", [False, True], ids=["quiet", "debug"])
def test_native_library_noise_stays_out_of_the_console_unless_debug(tmp_path, debug):
    """A rate the model does not take (8000): onnx-simplifier's check of its result fails inside ONNX Runtime,
    which logs red `[E:onnxruntime]` lines on file descriptor 2 before the exception temper turns into one line."""
    recipe = rate_recipe(tmp_path, ["simplify"], rate=8000)
    result = temper(*(["--debug"] if debug else []), "run", recipe, "--output", tmp_path / "out",
                    "--cache-dir", tmp_path / "cache")
    assert result.returncode == 1, result.stderr
    if not debug:
        assert "error: " in result.stderr and "simplify: onnx-simplifier failed" in result.stderr, result.stderr
    noise = [line for line in result.stderr.splitlines() if "[E:onnxruntime" in line or "[W:onnxruntime" in line]
    assert bool(noise) == debug, result.stderr
