"""Connects a run's models and data to the validators, for `temper run` and `temper validate`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from temper.artifacts.core.errors import RecipeError
from temper.artifacts.formats.integrity import Mismatch, check_built_files, read_manifest
from temper.pipeline.cache import MODEL_FILE, TUNING_FILE, OutputStore, RecordStore
from temper.pipeline.loading import LoadedRecipe
from temper.pipeline.outputs import MANIFEST, same_build
from temper.pipeline.runner import Runner, RunResult
from temper.pipeline.steps import candidate_precision
from temper.validators.validation import Subject


def subject(runner: Runner, baseline: Path, candidates: dict[str, Path | str],
            providers_active: bool = False) -> Subject:
    recipe, loaded = runner.recipe, runner.loaded
    assert recipe.validation is not None
    if runner.evaluation_set is None or recipe.data.evaluation is None:
        raise RecipeError(loaded.file, "data.evaluation", "validate needs an evaluation set: add data.evaluation")
    return Subject(
        recipe_name=recipe.name, recipe_file=loaded.file, base=loaded.base, spec=recipe.validation,
        rule=recipe.select, evaluation=runner.evaluation_set, eval_batch_size=recipe.data.evaluation.batch_size,
        calibration=runner.calibration_set, outputs=list(recipe.model.outputs), baseline=baseline,
        candidates=candidates, searches=loaded.searches,
        precisions={name: candidate_precision(recipe, name) for name in candidates},
        preset=None if loaded.preset_choice is None else {"target": loaded.preset_choice.target,
                                                          "preset": loaded.preset_choice.preset,
                                                          "reason": loaded.preset_choice.reason},
        tunings=tunings(candidates), layout=runner.layout(baseline), records=RecordStore.beside(runner.cache),
        kept=OutputStore.beside(runner.cache),
        serving_pad=dict(recipe.publish.serving.pad) if recipe.publish else {},
        serving_batch=recipe.publish.serving.max_batch_size if recipe.publish else 16,
        providers_active=providers_active,
    )


def tunings(candidates: dict[str, Path | str]) -> dict[str, dict[str, Any]]:
    """The quantize fallback's record (tuning.json beside the model) of each built candidate that has one."""
    return {name: json.loads((path.parent / TUNING_FILE).read_text()) for name, path in candidates.items()
            if isinstance(path, Path) and (path.parent / TUNING_FILE).is_file()}


def from_run(runner: Runner, result: RunResult, preflown: bool = False) -> Subject:
    """A run's models; `preflown`: pipeline/preflight.py already opened the baseline on every provider."""
    return subject(runner, result.baseline[-1].path,
                   {c.name: c.model.path if c.model else (c.error or "not built") for c in result.candidates},
                   providers_active=preflown)


def from_folder(runner: Runner, folder: Path) -> Subject:
    """The models an earlier `temper run` wrote, after checking they came from this recipe's build settings
    and that each file is still the one its manifest records (sha256)."""
    loaded: LoadedRecipe = runner.loaded
    if not (folder / MANIFEST).is_file():
        raise RecipeError(str(folder), "--output", "no manifest.json here: run `temper run` first")
    try:  # truncated by a full disk, edited by hand, another tool's
        manifest = read_manifest(folder, "run `temper run` to rebuild the folder")
    except Mismatch as exc:
        raise RecipeError(str(folder), "--output", f"{MANIFEST} {exc}") from None
    entries = manifest["candidates"]
    if not all(isinstance(e, dict) for e in entries.values()):
        raise RecipeError(str(folder), "--output", f"{MANIFEST} is not a temper manifest (a candidate entry is not a "
                                                   "mapping): run `temper run` to rebuild the folder")
    if not same_build(manifest.get("build_sha256"), runner.recipe):
        raise RecipeError(loaded.file, "", f"the models in {folder} were built from a different model, data or steps "
                                           "than this recipe now has: run `temper run` to rebuild them")
    candidates: dict[str, Path | str] = {}
    for name in runner.recipe.candidates:
        entry = entries.get(name, {})
        candidates[name] = (folder / name / MODEL_FILE if entry.get("status") == "ok"
                            else entry.get("error", "not built"))
    built = ["baseline", *(name for name, path in candidates.items() if isinstance(path, Path))]
    try:  # gate only the bytes `temper run` wrote: a replaced file would pass under the candidate's name
        check_built_files(folder, built, manifest, "rebuild the folder with `temper run`")
    except Mismatch as exc:
        raise RecipeError(str(exc.file), "", str(exc)) from None
    return subject(runner, folder / "baseline" / MODEL_FILE, candidates)
