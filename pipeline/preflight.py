"""The pre-flight: everything validation and publishing need that the baseline alone can tell, checked before
any candidate is built, so a bad recipe fails in seconds and `temper check` finds the same problems. Its one
home: `temper run` and `temper check` call preflight() once, and each question is asked once (a provider's
availability here before the baseline is built, its activation on the baseline once; validation then trusts
a Subject the pre-flight vouched for)."""

from __future__ import annotations

from temper.artifacts.core.errors import EnvironmentProblem, RecipeError
from temper.artifacts.engines.providers import PROVIDERS
from temper.pipeline.runner import Runner


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
    output, and the MLflow store answers. Returns what was checked."""
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
            for provider in spec.throughput.providers:  # available: precheck asked; now: does it really activate
                session_for(baseline, provider, asked=True)  # EnvironmentProblem (exit 3) unless it does
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
