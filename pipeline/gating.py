"""Connects a run's models and data to the validators, for `temper run` and `temper validate`."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.cache import MODEL_FILE
from pipeline.errors import RecipeError
from pipeline.loading import LoadedRecipe
from pipeline.outputs import MANIFEST, build_fingerprint
from pipeline.runner import Runner, RunResult
from validators.validation import Subject


def subject(runner: Runner, baseline: Path, candidates: dict[str, Path | str]) -> Subject:
    recipe, loaded = runner.recipe, runner.loaded
    assert recipe.validation is not None
    if runner.evaluation_set is None or recipe.data.evaluation is None:
        raise RecipeError(loaded.file, "data.evaluation", "validate needs an evaluation set: add data.evaluation")
    return Subject(
        recipe_name=recipe.name, recipe_file=loaded.file, base=loaded.base, spec=recipe.validation,
        rule=recipe.select, evaluation=runner.evaluation_set, eval_batch_size=recipe.data.evaluation.batch_size,
        calibration=runner.calibration_set, outputs=list(recipe.model.outputs), baseline=baseline,
        candidates=candidates, searches=loaded.searches,
        precisions={name: recipe.precision(name) for name in candidates},
        preset=None if loaded.preset_choice is None else {"target": loaded.preset_choice.target,
                                                          "preset": loaded.preset_choice.preset,
                                                          "reason": loaded.preset_choice.reason},
    )


def precheck(runner: Runner) -> None:
    """What validation needs that can be checked before minutes of building: data and providers."""
    from validators.throughput import require_available

    spec = runner.recipe.validation
    if spec is None:
        return
    if runner.evaluation_set is None:
        raise RecipeError(runner.loaded.file, "data.evaluation", "validate needs an evaluation set: add data.evaluation")
    if spec.accuracy and spec.accuracy.metric == "probe" and (runner.calibration_set is None or runner.calibration_set.labels is None):
        raise RecipeError(runner.loaded.file, "validate.accuracy.metric",
                          "metric probe trains on the baseline's outputs of the calibration set: "
                          "add data.calibration with a label column")
    for provider in spec.throughput.providers if spec.throughput else ():
        require_available(provider)


def from_run(runner: Runner, result: RunResult) -> Subject:
    return subject(runner, result.baseline[-1].path,
                   {c.name: c.model.path if c.model else c.error for c in result.candidates})


def from_folder(runner: Runner, folder: Path) -> Subject:
    """The models an earlier `temper run` wrote, after checking they came from this recipe's build settings."""
    loaded: LoadedRecipe = runner.loaded
    manifest_path = folder / MANIFEST
    if not manifest_path.is_file():
        raise RecipeError(str(folder), "--output", "no manifest.json here: run `temper run` first")
    manifest = json.loads(manifest_path.read_text())
    if manifest.get("build_sha256") != build_fingerprint(runner.recipe):
        raise RecipeError(loaded.file, "", f"the models in {folder} were built from a different model, data or steps "
                                           "than this recipe now has: run `temper run` to rebuild them")
    candidates: dict[str, Path | str] = {}
    for name in runner.recipe.candidates:
        entry = manifest["candidates"].get(name, {})
        candidates[name] = folder / name / MODEL_FILE if entry.get("status") == "ok" else entry.get("error", "not built")
    return subject(runner, folder / "baseline" / MODEL_FILE, candidates)
