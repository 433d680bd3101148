"""The run's output folder: staged beside the target and swapped in whole, so a failed or interrupted
run never leaves a folder that looks like a finished one."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from artifacts.host import profile
from pipeline.cache import MODEL_FILE, TUNING_FILE, key_of
from pipeline.errors import RecipeError
from pipeline.loading import LoadedRecipe
from pipeline.recipe import Recipe
from pipeline.runner import ModelRecord, RunResult, library_versions

MANIFEST = "manifest.json"


def build_fingerprint(recipe: Recipe) -> str:
    """Hash of everything that shapes the models (not the gates): `temper validate` re-gates only matching builds."""
    return key_of(**recipe.model_dump(mode="json", by_alias=True, exclude={"validation", "select"}))


class OutputFolder:
    def __init__(self, target: Path) -> None:
        """Check now, before any heavy work, that `target` can be written and is ours to replace."""
        self.target = target.resolve()
        if self.target.exists() and not self.target.is_dir():
            raise RecipeError(str(target), "--output", "exists and is not a folder")
        if self.target.is_dir() and any(self.target.iterdir()) and not (self.target / MANIFEST).is_file():
            raise RecipeError(str(target), "--output", "exists, is not empty and holds no temper manifest.json; "
                                                       "choose another folder or empty it")
        try:
            self.target.parent.mkdir(parents=True, exist_ok=True)
            self.staging = Path(tempfile.mkdtemp(dir=self.target.parent, prefix=f".{self.target.name}.partial-"))
        except OSError as exc:
            raise RecipeError(str(target), "--output", f"not writable ({exc.strerror}); choose a folder you can write") from None

    def discard(self) -> None:
        shutil.rmtree(self.staging, ignore_errors=True)

    def commit(self, loaded: LoadedRecipe, result: RunResult, reports: Callable[[Path], object] | None = None) -> Path:
        """Copy each final model into the staging folder, write the manifest (and `reports` into the
        folder, when given), then swap it into place."""
        _copy_model(result.baseline[-1], self.staging / "baseline")
        for outcome in result.candidates:
            if outcome.model is not None:
                _copy_model(outcome.model, self.staging / outcome.name)
        if reports is not None:
            reports(self.staging)
        (self.staging / MANIFEST).write_text(json.dumps(manifest(loaded, result), indent=2) + "\n")
        old = None
        if self.target.exists():
            old = self.target.with_name(f".{self.target.name}.old-{os.getpid()}")
            os.replace(self.target, old)
        os.replace(self.staging, self.target)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return self.target


def _copy_model(record: ModelRecord, folder: Path) -> None:
    folder.mkdir()
    for item in record.path.parent.iterdir():  # model.onnx, any external-data file and tuning.json beside it
        if item.name in (MODEL_FILE, TUNING_FILE) or item.name.startswith(MODEL_FILE + "."):
            shutil.copy2(item, folder / item.name)


def manifest(loaded: LoadedRecipe, result: RunResult) -> dict[str, Any]:
    """Lineage of every model: parent, step, options, sha256, size, seconds, and the library versions."""
    records = {r.id: r for r in result.baseline}
    for outcome in result.candidates:
        records.update({r.id: r for r in outcome.records})
    return {
        "recipe": {"name": loaded.recipe.name, "file": loaded.file, "sha256": loaded.sha256,
                   "resolved": loaded.recipe.model_dump(mode="json", by_alias=True)},
        "build_sha256": build_fingerprint(loaded.recipe),
        "versions": library_versions(),
        "host": profile().model_dump(),  # the machine that built (and, with validate, gated) these models
        "baseline": {"model": result.baseline[-1].id, "path": f"baseline/{MODEL_FILE}"},
        "candidates": {
            o.name: {"status": "failed" if o.error else "ok", "model": o.model.id if o.model else None,
                     "path": f"{o.name}/{MODEL_FILE}" if o.model else None, "error": o.error}
            for o in result.candidates
        },
        "models": [r.as_dict() for r in records.values()],
    }
