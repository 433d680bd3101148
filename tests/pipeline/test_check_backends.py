"""`temper check` is the complete pre-flight for the quantize backends, through the console script: a backend
that is not installed (NNCF, ModelOpt) is one line and exit 3, and ModelOpt on inputs it cannot calibrate (a
batch axis off 0, a constant input) one line naming the step's `backend`, exit 2, at check and before `run`
builds anything. `check` passed all of these, and `run` failed on them after building the other candidates."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.pipeline.test_batch_axis import _model

TEMPER = str(Path(sys.executable).parent / "temper")


def _temper(*args: object, hidden: Path | None = None) -> subprocess.CompletedProcess[str]:
    """The console script; with `hidden`, a folder first on PYTHONPATH whose packages shadow installed ones."""
    env = dict(os.environ)
    if hidden is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(hidden), *filter(None, [env.get("PYTHONPATH")])])
    return subprocess.run([TEMPER, *map(str, args)], capture_output=True, text=True, timeout=300, env=env)


def _not_installed(folder: Path, *packages: str) -> Path:
    """A folder of packages that fail to import as a missing one does."""
    for package in packages:
        (folder / package).mkdir(parents=True)
        (folder / package / "__init__.py").write_text(f"raise ImportError(\"No module named '{package}'\")\n")
    return folder


def _recipe(folder: Path, backend: str, inputs: list[dict] | None = None) -> Path:
    inputs = inputs or [{"name": "x", "shape": ["batch", 4]}]
    graph = {i["name"]: i["shape"] if i.get("value") is None else [1, 4] for i in inputs}
    _model(folder / "m.onnx", graph)
    rng = np.random.default_rng(0)
    for name in ("calib", "eval"):
        np.savez(folder / f"{name}.npz", x=rng.standard_normal((32, 4)).astype(np.float32))
    recipe = folder / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({
        "version": 1, "name": "backends",
        "model": {"onnx": "m.onnx", "inputs": inputs, "outputs": ["y"]},
        "data": {"calibration": {"path": "calib.npz", "batch_size": 8},
                 "evaluation": {"path": "eval.npz", "batch_size": 8}},
        "candidates": {"fp16": {"steps": ["fp16"]},
                       "int8": {"steps": [{"quantize": {"mode": "static", "backend": backend}}]}},
    }, sort_keys=False))
    return recipe


def _line(result: subprocess.CompletedProcess[str], code: int) -> str:
    assert result.returncode == code and "Traceback" not in result.stderr, (result.returncode, result.stderr)
    lines = [line.strip() for line in result.stderr.splitlines() if line.strip()]
    assert all(line.startswith("✓ ") for line in lines[:-1]), result.stderr
    return lines[-1]


@pytest.mark.parametrize(("backend", "package", "extra"), [("nncf", "nncf", "nncf"),
                                                           ("modelopt", "modelopt", "modelopt")])
def test_a_backend_that_is_not_installed_is_exit_3_at_check_and_before_run_builds(
        tmp_path: Path, backend: str, package: str, extra: str) -> None:
    recipe = _recipe(tmp_path, backend)
    hidden = _not_installed(tmp_path / "hidden", package)
    line = _line(_temper("check", recipe, hidden=hidden), 3)
    assert f"pip install 'temper-ml[{extra}]'" in line, line
    out = tmp_path / "out"
    result = _temper("run", recipe, "--output", out, hidden=hidden)
    assert _line(result, 3) == line
    assert "fp16" not in result.stderr and not out.exists()  # nothing was built first


@pytest.mark.parametrize("inputs", [
    [{"name": "x", "shape": [4, "batch"], "batch_axis": 1}],
    [{"name": "x", "shape": ["batch", 4]}, {"name": "b", "shape": [1, 4], "value": [[0.5, 0.5, 0.5, 0.5]]}],
], ids=["batch-axis-1", "a-constant-input"])
def test_modelopt_on_inputs_it_cannot_calibrate_is_refused_at_check(tmp_path: Path, inputs: list[dict]) -> None:
    """Refused before the baseline runs on a batch: the graph need not compute anything sensible here."""
    recipe = _recipe(tmp_path, "modelopt", inputs)
    line = _line(_temper("check", recipe), 2)
    assert line.startswith(f"error: {recipe}: candidates.int8.steps[0].quantize.backend: backend modelopt "
                           "calibrates inputs batched on axis 0 only"), line
    assert "use backend: ort" in line
