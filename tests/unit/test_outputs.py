"""pipeline.outputs.OutputFolder: which folders it may replace, where it stages, and the swap itself.

The models are tiny byte files: the folder copies them byte for byte and never parses a cached model.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from temper.artifacts.core.errors import RecipeError
from temper.artifacts.core.folders import MARKER, is_marked, mark
from temper.pipeline.loading import LoadedRecipe, load_recipe
from temper.pipeline.outputs import MANIFEST, OutputFolder
from temper.pipeline.runner import CandidateOutcome, ModelRecord, RunResult

DIGITS = Path(__file__).resolve().parents[2] / "recipes" / "digits-cnn.yaml"


def _record(folder: Path, model_id: str, payload: bytes, parent: str | None = None) -> ModelRecord:
    """A cached model as the runner leaves it: model.onnx in its own folder, with external data beside it."""
    folder.mkdir(parents=True)
    (folder / "model.onnx").write_bytes(payload)
    (folder / "model.onnx.data").write_bytes(payload * 2)
    (folder / "meta.json").write_text("{}")  # the cache's, not the model's: never copied
    return ModelRecord(model_id, parent, "simplify", {}, folder / "model.onnx", hashlib.sha256(payload).hexdigest(),
                       len(payload), 0.1, True)


def _result(tmp_path: Path) -> tuple[LoadedRecipe, RunResult]:
    baseline = _record(tmp_path / "cache" / "base", "baseline/1-simplify", b"base")
    fp16 = _record(tmp_path / "cache" / "fp16", "fp16/1-fp16", b"half", baseline.id)
    failed = CandidateOutcome("int8-static", [baseline], error="quantize: boom")
    return load_recipe(DIGITS), RunResult([baseline], [CandidateOutcome("fp16", [fp16]), failed])


def test_refuses_an_unmarked_non_empty_folder(tmp_path):
    target = tmp_path / "out"
    target.mkdir()
    (target / "notes.txt").write_text("mine")
    with pytest.raises(RecipeError, match=f"holds no temper {MANIFEST} nor {MARKER} marker"):
        OutputFolder(target)
    assert (target / "notes.txt").read_text() == "mine"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # nothing staged beside it


def test_refuses_an_output_without_its_marker(tmp_path):
    target = tmp_path / "out"
    target.mkdir()
    (target / MANIFEST).write_text("{}")
    with pytest.raises(RecipeError, match="an older temper's output or another tool's"):
        OutputFolder(target)


def test_refuses_a_file(tmp_path):
    (tmp_path / "out").write_text("x")
    with pytest.raises(RecipeError, match="exists and is not a folder"):
        OutputFolder(tmp_path / "out")


def test_stages_beside_the_target_under_this_process_id(tmp_path):
    folder = OutputFolder(tmp_path / "new" / "out")  # missing parents are made
    assert folder.staging.parent == (tmp_path / "new").resolve() and folder.staging.is_dir()
    assert folder.staging.name.startswith(f".out.partial-{os.getpid()}-")
    folder.discard()
    assert not folder.staging.exists()


def test_sweeps_a_dead_runs_staging_but_not_a_live_one(tmp_path):
    dead = tmp_path / ".out.partial-99999999-abcd"  # no such process
    live = tmp_path / f".out.partial-{os.getppid()}-abcd"  # pytest's parent: alive
    dead.mkdir()
    live.mkdir()
    OutputFolder(tmp_path / "out").discard()
    assert not dead.exists() and live.exists()


def test_an_empty_folder_is_ours_to_fill(tmp_path):
    (tmp_path / "out").mkdir()
    OutputFolder(tmp_path / "out").discard()


def test_commit_replaces_a_marked_folder_with_the_staged_models(tmp_path):
    loaded, result = _result(tmp_path)
    target = tmp_path / "out"
    target.mkdir()
    mark(target, recipe="older")
    (target / "stale.txt").write_text("from the previous run")
    committed: list[Path] = []  # what the CLI reports on an interrupt after the commit
    folder = OutputFolder(target, committed)

    assert folder.commit(loaded, result, reports=lambda f: (f / "report.md").write_text("# ok\n")) == target.resolve()
    assert committed == [target.resolve()]
    assert sorted(p.name for p in target.iterdir()) == [MARKER, "baseline", "fp16", MANIFEST, "report.md"]
    assert (target / "baseline" / "model.onnx").read_bytes() == b"base"
    assert sorted(p.name for p in (target / "fp16").iterdir()) == ["model.onnx", "model.onnx.data"]
    assert is_marked(target) and json.loads((target / MARKER).read_text())["recipe"] == "digits-cnn"
    manifest = json.loads((target / MANIFEST).read_text())
    assert manifest["candidates"]["fp16"] == {"status": "ok", "model": "fp16/1-fp16", "path": "fp16/model.onnx",
                                              "error": None}
    assert manifest["candidates"]["int8-static"]["status"] == "failed"
    assert [m["id"] for m in manifest["models"]] == ["baseline/1-simplify", "fp16/1-fp16"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no staging nor old copy left


def test_commit_refuses_a_folder_that_became_foreign_meanwhile(tmp_path):
    loaded, result = _result(tmp_path)
    target = tmp_path / "out"
    folder = OutputFolder(target)
    target.mkdir()
    (target / "precious.txt").write_text("someone else's")
    with pytest.raises(RecipeError, match="--output"):
        folder.commit(loaded, result)
    assert (target / "precious.txt").exists()
    folder.discard()
