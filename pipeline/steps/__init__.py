"""The step registry: recipe step name -> implementation, registered explicitly, one module (or, for
quantize, one subpackage) each.

Everything temper asks about a step by name is answered here from the step's own declarations
(pipeline/steps/base.py): its options model and searchable keys (pipeline/search.py, `temper schema`),
the data its output depends on (the cache key, `temper check`), the precision a candidate ends in.
Importing the registry imports no step's heavy libraries (see base.py), so the loader may read it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from temper.pipeline.recipe import Recipe, StepSpec
from temper.pipeline.steps.base import Step
from temper.pipeline.steps.fix_shapes import FixShapes
from temper.pipeline.steps.fp16 import Fp16
from temper.pipeline.steps.quantize import Quantize
from temper.pipeline.steps.simplify import Simplify

STEPS: dict[str, Step] = {step.name: step for step in (Simplify(), FixShapes(), Fp16(), Quantize())}

UNCHANGED = "fp32"  # the precision of a model no step has converted


def precision_of(steps: Iterable[StepSpec]) -> str:
    """fp32, fp16, int8-static or int8-dynamic: what these steps make of an FP32 model.

    Each step says what it leaves (`Step.precision`); the narrowest format wins (FP16 after INT8 leaves
    the INT8 weights as they are), and of two equally narrow ones the later step's.
    """
    label = UNCHANGED
    for spec in steps:
        made = STEPS[spec.name].precision(spec.options)
        if made is not None and _bits(made) <= _bits(label):
            label = made
    return label


def _bits(label: str) -> int:
    return int(re.search(r"\d+", label).group())  # type: ignore[union-attr]  # every label names its width


def candidate_precision(recipe: Recipe, name: str) -> str:
    """A candidate's precision label; "baseline" (no steps of its own) is fp32."""
    return precision_of(recipe.candidates[name].steps if name in recipe.candidates else [])


def uses_calibration(steps: Iterable[StepSpec]) -> bool:
    """Whether any of these steps needs the calibration set (`temper check` loads it then)."""
    return any(STEPS[spec.name].uses_calibration(spec.options) for spec in steps)


def uses_evaluation(steps: Iterable[StepSpec]) -> bool:
    """Whether any of these steps aims at the accuracy budget (it needs validate.accuracy and data.evaluation)."""
    return any(STEPS[spec.name].uses_evaluation(spec.options) for spec in steps)


def searchable() -> dict[str, tuple[str, ...]]:
    """Step name -> the options a recipe may give a list of alternatives for (steps with none left out)."""
    return {name: step.searchable for name, step in STEPS.items() if step.searchable}
