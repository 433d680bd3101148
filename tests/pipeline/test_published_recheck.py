"""`temper validate` trusts only the model files its manifest records, and re-checks a published version
(`--model models:/NAME@ALIAS`) on this host and runtime: the real digits recipe, a real sqlite MLflow store."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from temper.artifacts.core import versions
from tests.helpers import edit_recipe

URI = "models:/digits-cnn@candidate"


def _speed_not_decisive(recipe: Path) -> None:
    """A speed budget every candidate clears on a loaded machine: the re-check is about accuracy and fidelity
    here, and a noisy 2-core host must not make the published candidate look as if it no longer passed."""
    edit_recipe(recipe, lambda d: d["validate"]["throughput"].update(min_speedup=0.2))


def _one_line(stderr: str) -> str:
    (line,) = stderr.strip().splitlines()
    return line


@pytest.mark.slow
def test_validate_refuses_a_model_file_the_manifest_does_not_record(temper, gated_digits, tmp_path):
    edit_recipe(gated_digits, lambda d: d.pop("publish"))
    out = tmp_path / "out"
    assert temper("run", gated_digits, "--output", out).code == 0
    report = (out / "report.json").read_bytes()
    shutil.copy2(out / "baseline" / "model.onnx", out / "int8-dynamic" / "model.onnx")
    result = temper("validate", gated_digits, "--output", out)
    line = _one_line(result.stderr)
    assert result.code == 2 and line.startswith(
        f"error: {out.resolve()}/int8-dynamic/model.onnx: is not the int8-dynamic model manifest.json records"), line
    assert "rebuild the folder with `temper run`" in line, line
    assert (out / "report.json").read_bytes() == report  # nothing was gated, nothing rewritten


@pytest.mark.slow
def test_validate_model_rechecks_a_published_version_with_its_recorded_gates(temper, gated_digits, tmp_path,
                                                                             tracking_store):
    _speed_not_decisive(gated_digits)
    out = tmp_path / "out"
    assert temper("run", gated_digits, "--output", out).code == 0
    selected = json.loads((out / "report.json").read_text())["selected"]

    recheck = tmp_path / "recheck"
    result = temper("validate", gated_digits, "--model", URI, "--output", recheck)
    assert result.code == 0, result.stderr
    assert (f"re-checked: models:/digits-cnn/1 (candidate {selected}) still passes its recorded gates here; "
            "same runtime versions as when gated") in result.stdout, result.stdout
    again = json.loads((recheck / "report.json").read_text())
    assert selected == "baseline" or again["candidates"][selected]["passed"]  # which one is fastest may change
    assert (recheck / "manifest.json").read_bytes() == (out / "manifest.json").read_bytes()  # the run's own models
    assert (recheck / "int8-dynamic" / "model.onnx").read_bytes() == (out / "int8-dynamic" / "model.onnx").read_bytes()

    pulled = tmp_path / "pulled"
    assert temper("pull", URI, "--dest", pulled).code == 0
    assert json.loads((pulled / "runtime.json").read_text())["gated_with"] == versions.current()

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    refused = temper("validate", gated_digits, "--model", URI, "--output", mine)
    line = _one_line(refused.stderr)
    assert refused.code == 2 and line.startswith(f"error: {mine}: --output: "), line
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]

    unknown = temper("validate", gated_digits, "--model", "models:/digits-cnn@nobody")
    line = _one_line(unknown.stderr)
    assert unknown.code == 2 and line.startswith("error: models:/digits-cnn@nobody: --model: "), line

    edit_recipe(gated_digits, lambda d: d["validate"]["accuracy"].update(max_drop=0.5))
    moved = temper("validate", gated_digits, "--model", URI)
    line = _one_line(moved.stderr)
    assert moved.code == 2 and line.startswith(
        f"error: {gated_digits}: validate.accuracy.max_drop: is 0.5 here but 0.01 in the gates models:/digits-cnn/1 "
        "was published with"), line


@pytest.mark.slow
def test_validate_model_refuses_a_changed_copy_in_the_store(temper, gated_digits, tmp_path, tracking_store):
    _speed_not_decisive(gated_digits)
    out = tmp_path / "out"
    assert temper("run", gated_digits, "--output", out).code == 0
    artifacts = Path(tracking_store.removeprefix("sqlite:///")).parent / "mlartifacts"
    (logged,) = [p for p in artifacts.rglob("model.onnx") if p.parent.name == "int8-dynamic"
                 and p.parent.parent.name == "output"]
    shutil.copy2(out / "baseline" / "model.onnx", logged)
    recheck = tmp_path / "recheck"
    result = temper("validate", gated_digits, "--model", URI, "--output", recheck)
    line = _one_line(result.stderr)
    assert result.code == 2 and line.startswith(
        f"error: {recheck}/int8-dynamic/model.onnx: is not the int8-dynamic model manifest.json records"), line
