"""Connects a run's models and data to the validators, for `temper run` and `temper validate`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from temper.artifacts.core.errors import EnvironmentProblem, RecipeError
from temper.artifacts.engines.providers import PROVIDERS
from temper.artifacts.formats.integrity import Mismatch, check_output, read_manifest
from temper.pipeline.cache import MODEL_FILE, TUNING_FILE, OutputStore, RecordStore
from temper.pipeline.loading import LoadedRecipe
from temper.pipeline.outputs import MANIFEST, same_build
from temper.pipeline.runner import Runner, RunResult
from temper.pipeline.steps import candidate_precision
from temper.validators.validation import Subject


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
        precisions={name: candidate_precision(recipe, name) for name in candidates},
        preset=None if loaded.preset_choice is None else {"target": loaded.preset_choice.target,
                                                          "preset": loaded.preset_choice.preset,
                                                          "reason": loaded.preset_choice.reason},
        tunings=tunings(candidates), layout=runner.layout(baseline), records=RecordStore.beside(runner.cache),
        kept=OutputStore.beside(runner.cache),
        serving_pad=dict(recipe.publish.serving.pad) if recipe.publish else {},
        serving_batch=recipe.publish.serving.max_batch_size if recipe.publish else 16,
    )


def tunings(candidates: dict[str, Path | str]) -> dict[str, dict[str, Any]]:
    """The quantize fallback's record (tuning.json beside the model) of each built candidate that has one."""
    return {name: json.loads((path.parent / TUNING_FILE).read_text()) for name, path in candidates.items()
            if isinstance(path, Path) and (path.parent / TUNING_FILE).is_file()}


def precheck(runner: Runner) -> None:
    """What validation needs that can be checked before minutes of building: data and providers."""
    from temper.validators.throughput import require_available

    spec = runner.recipe.validation
    if spec is None:
        return
    if runner.evaluation_set is None:
        raise RecipeError(runner.loaded.file, "data.evaluation",
                          "validate needs an evaluation set: add data.evaluation")
    if (spec.accuracy and spec.accuracy.metric == "probe"
            and (runner.calibration_set is None or runner.calibration_set.labels is None)):
        raise RecipeError(runner.loaded.file, "validate.accuracy.metric",
                          "metric probe trains on the baseline's outputs of the calibration set: "
                          "add data.calibration with a label column")
    for provider in spec.throughput.providers if spec.throughput else ():
        require_available(provider)


def preflight(runner: Runner, tracking: str | None = None) -> list[str]:
    """Everything validation and publishing need that the baseline alone can tell, so `temper run`
    fails on it before building any candidate and `temper check` finds it too: the baseline runs on one
    real batch laid out as model.inputs says, the metric fits the baseline's outputs, each provider
    really activates, each batch size fits in memory and in the model, every fidelity slice fits its
    output, and the MLflow store answers. The one home of the pre-flight checks: `temper run` and
    `temper check` call it once. Returns what was checked."""
    from temper.artifacts.core.onnx_io import fixed_batch, load_structure
    from temper.pipeline.slice_check import check_slices
    from temper.validators.throughput import fits_in_memory, session_for

    precheck(runner)
    spec, loaded = runner.recipe.validation, runner.loaded
    done = _step_needs(runner)
    data, baseline = runner.recipe.data, runner.baseline()[-1].path
    if data.evaluation is not None or data.calibration is not None:
        layout = runner.layout(baseline)  # runs it on a real batch: RecipeError naming the input when it cannot
        axes = ", ".join(f"{name} {axis}" for name, axis in layout.outputs.items())
        done.append(f"the baseline runs on a real batch laid out as model.inputs says (outputs' batch axes: "
                    f"{axes or '0, a fixed batch'})")
    if spec is not None:
        if spec.accuracy is not None:
            reference = runner.scorer.reference
            done.append(f"validate.accuracy: {reference.metric.name} on output '{reference.output}' fits the "
                        f"baseline's outputs (baseline scores {reference.value:.4f})")
        if spec.throughput is not None:
            assert runner.evaluation_set is not None  # precheck
            for provider in spec.throughput.providers:
                session_for(baseline, provider)  # EnvironmentProblem (exit 3) unless it really activates
            fixed = fixed_batch(load_structure(baseline), runner.layout(baseline))
            for index, size in enumerate(spec.throughput.batch_sizes):
                problem = fits_in_memory(runner.evaluation_set.features, size) or (
                    f"baseline: the model's batch dim is fixed to {fixed}, so batch size {size} cannot run; "
                    "export the model with a dynamic batch dim" if fixed is not None and size != fixed else None)
                if problem:
                    raise RecipeError(loaded.file, f"validate.throughput.batch_sizes[{index}]", problem)
            done.append(f"validate.throughput: providers {', '.join(spec.throughput.providers)} active, batch sizes "
                        f"{spec.throughput.batch_sizes} fit in memory")
            if any(PROVIDERS[p].gpu for p in spec.throughput.providers):  # what a GPU figure will be measured on
                from temper.artifacts.core import nvidia

                done.append(f"GPU stack: {nvidia.summary(nvidia.read_facts())}")
    done += check_slices(runner)  # fidelity slices against the baseline's output shapes
    if runner.recipe.publish is not None:
        from temper.artifacts.registry.store import StoreUnreachable, open_store, tracking_uri

        try:
            open_store(tracking)
        except StoreUnreachable as exc:
            raise EnvironmentProblem(str(exc)) from exc
        done.append(f"publish: MLflow store {tracking_uri(tracking)} answers")
    return done


def _step_needs(runner: Runner) -> list[str]:
    """What each quantize step needs of this host and of the recipe's inputs (its backend installed, inputs
    ModelOpt can calibrate), before any step is built: a run would otherwise fail on it after the others."""
    from temper.artifacts.core.errors import OptionError
    from temper.pipeline.quantize_backends import BACKENDS, QuantizeCommon
    from temper.pipeline.steps.quantize.quantize import preflight as quantize_preflight

    recipe, file = runner.recipe, runner.loaded.file
    steps = [(f"steps[{i}]", s) for i, s in enumerate(recipe.steps)]
    for name, candidate in recipe.candidates.items():
        steps += [(f"candidates.{name}.steps[{i}]", s) for i, s in enumerate(candidate.steps)]
    backends = set()
    for where, step in steps:
        if isinstance(step.options, QuantizeCommon):
            try:
                quantize_preflight(step.options, runner.input_layout)
            except OptionError as exc:
                raise RecipeError(file, f"{where}.{step.name}.{exc.key}", exc.message) from None
            backends.add(step.options.backend)
    return [f"quantize backends installed here: {', '.join(BACKENDS[b].label for b in sorted(backends))}"] if backends \
        else []


def from_run(runner: Runner, result: RunResult) -> Subject:
    return subject(runner, result.baseline[-1].path,
                   {c.name: c.model.path if c.model else (c.error or "not built") for c in result.candidates})


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
        check_output(folder, built, manifest, "rebuild the folder with `temper run`")
    except Mismatch as exc:
        raise RecipeError(str(exc.file), "", str(exc)) from None
    return subject(runner, folder / "baseline" / MODEL_FILE, candidates)
