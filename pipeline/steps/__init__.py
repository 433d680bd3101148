"""The step registry: recipe step name -> implementation. Registered explicitly, one module each."""

from __future__ import annotations

from pipeline.steps.base import Step
from pipeline.steps.fix_shapes import FixShapes
from pipeline.steps.fp16 import Fp16
from pipeline.steps.quantize import Quantize
from pipeline.steps.simplify import Simplify

STEPS: dict[str, Step] = {step.name: step for step in (Simplify(), FixShapes(), Fp16(), Quantize())}
