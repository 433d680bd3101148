"""`temper check`: everything a run would reject, found without building any candidate."""

from __future__ import annotations

from dataclasses import dataclass

from temper.artifacts.core import onnx_io
from temper.artifacts.core.callables import load_callable
from temper.artifacts.core.errors import OptionError, RecipeError
from temper.pipeline.preflight import preflight
from temper.pipeline.quantize_backends import BACKENDS, QuantizeCommon
from temper.pipeline.recipe import StepSpec
from temper.pipeline.runner import Runner
from temper.pipeline.slice_check import mixed_scale_notices
from temper.pipeline.steps import STEPS, uses_calibration
from temper.pipeline.steps.quantize.census_check import subgraph_notice
from temper.validators.census import Census, of_file


@dataclass(frozen=True)
class Checked:
    """What `temper check` prints: each check that held (✓), then each notice (!)."""

    done: list[str]  # what was checked and holds
    notices: list[str]  # what holds but will not do all the recipe may expect (compute a quantizer leaves float)


def check(runner: Runner, tracking: str | None = None) -> Checked:
    """Return what was checked and what to know (for the user); raise RecipeError on the first problem
    (EnvironmentProblem for a provider or an MLflow store that is not there, StepFailed, exit 1, when the
    baseline cannot be built)."""
    recipe, loaded = runner.recipe, runner.loaded
    if recipe.model.factory is not None:
        load_callable(recipe.model.factory, loaded.base, loaded.file, "model.factory")
        done = [f"model factory {recipe.model.factory} imports"]
    else:
        done = [f"model {runner.source().path.name} is valid ONNX with the declared inputs and outputs"]
    for which in ("calibration", "evaluation"):
        data = getattr(runner, f"{which}_set")
        if data is not None:
            done.append(f"data.{which}: {len(data)} samples")
    steps = [(f"steps[{i}]", s) for i, s in enumerate(recipe.steps)]
    for name, candidate in recipe.candidates.items():
        steps += [(f"candidates.{name}.steps[{i}]", s) for i, s in enumerate(candidate.steps)]
    if uses_calibration(s for _, s in steps):
        done.append(f"calibration: {len(runner.calibration_batches)} full batches")
    baseline = runner.baseline()[-1]
    done.append(f"baseline model builds ({baseline.bytes:,} bytes{', cached' if baseline.cached else ''})")
    graph = onnx_io.load_structure(baseline.path)
    for where, spec in steps[len(recipe.steps):]:
        try:
            STEPS[spec.name].validate(graph, spec.options)
        except OptionError as exc:
            raise RecipeError(loaded.file, f"{where}.{spec.name}.{exc.key}", exc.message) from None
    done.append(f"{len(steps) - len(recipe.steps)} candidate steps match the baseline graph")
    done += preflight(runner, tracking)
    return Checked(done, notices(runner))


def notices(runner: Runner) -> list[str]:
    """What holds but will not do all the recipe may expect, from the baseline (built once, cached): compute a
    quantizer will leave float, an output whose rows differ in scale. `temper check` and `temper run` both
    print them, so the same model is forecast the same way in both."""
    recipe, baseline = runner.recipe, runner.baseline()[-1].path
    steps = [(f"candidates.{name}.steps[{i}]", s) for name, candidate in recipe.candidates.items()
             for i, s in enumerate(candidate.steps)]
    return _subgraph_notices(of_file(baseline), steps) + mixed_scale_notices(runner, baseline)


def _subgraph_notices(counted: Census, steps: list[tuple[str, StepSpec]]) -> list[str]:
    """One line per candidate quantize step when the baseline keeps compute inside If/Loop/Scan bodies."""
    notices = []
    for where, spec in steps:
        if isinstance(spec.options, QuantizeCommon):
            line = subgraph_notice(counted, BACKENDS[spec.options.backend].label)
            if line:
                notices.append(f"{where}.{spec.name}: {line}")
    return notices
