"""Simplify: onnx-simplifier's constant folding and redundant-node elimination.

A failed simplification is an error, never a silent pass-through of the input. With
`check_n: 0` onnxsim only runs the ONNX checker and reports success even for a graph that
ONNX Runtime refuses to load, so the result is always opened in a session before it counts.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import numpy as np

from temper.artifacts.core import native_logs
from temper.artifacts.core.errors import StepFailed, first_line
from temper.artifacts.core.onnx_io import dims, fit_batch, load_structure, save, session
from temper.pipeline.step_options import SimplifyOptions
from temper.pipeline.steps.base import Step, StepContext

# A failed simplification has no fix inside the step: the way out is a chain without it, and what that costs.
WITHOUT = ("remove this simplify step (the cost: the model keeps the constants and redundant nodes onnxsim would "
           "fold; ONNX Runtime folds most of them itself when it loads the model)")


def _check_data(src: Path, ctx: StepContext) -> dict[str, np.ndarray] | None:
    """The inputs onnxsim checks its result on when the recipe has constant inputs: a real batch, the constants
    at their values. onnxsim's own are random, and a constant that picks a branch (Silero VAD's `sr`, 16000)
    then picks one the model cannot run (any other rate fails inside it): the check failed on a sound model."""
    if not ctx.layout.constants:
        return None
    return fit_batch(load_structure(src), ctx.sample(), ctx.layout)


def _check_shapes(src: Path, ctx: StepContext) -> dict[str, list[int]] | None:
    """Input shapes for onnxsim's random check, from a real batch, when onnxsim cannot size them.

    onnxsim sets a symbolic leading dim to 1 itself but raises on any other symbolic dim.
    """
    structure = load_structure(src)
    if all(isinstance(d, int) and d > 0 for shape in dims(structure).values() for d in shape[1:]):
        return None
    return {name: list(array.shape) for name, array in fit_batch(structure, ctx.sample(), ctx.layout).items()}


class Simplify(Step[SimplifyOptions]):
    name = "simplify"
    options_model = SimplifyOptions

    def run(self, src: Path, dst: Path, options: SimplifyOptions, ctx: StepContext) -> None:
        import onnxsim  # imports torch: only when a model is simplified

        data = _check_data(src, ctx) if options.check_n else None
        shapes = _check_shapes(src, ctx) if options.check_n and data is None else None
        log = io.StringIO()
        try:
            # A path (not a ModelProto) lets onnxsim resolve external data next to `src`
            # and take its external-data route for models past protobuf's 2 GB limit.
            with contextlib.redirect_stdout(log), native_logs.silenced():  # its C++ writes on fds 1 and 2
                model, check_ok = onnxsim.simplify(
                    str(src),
                    check_n=options.check_n,
                    skip_fuse_bn=options.skip_fuse_bn,
                    test_input_shapes=shapes,
                    input_data=data,
                )
        except Exception as err:  # onnxsim raises anything from RuntimeError to ORT's Fail
            raise StepFailed(f"simplify: onnx-simplifier failed: {first_line(err).rstrip('.')}; {WITHOUT}") from err
        if not check_ok:
            changed = [line for line in log.getvalue().splitlines() if "changes after optimization" in line]
            reason = changed[0].strip() if changed else "outputs differ from the input model's"
            raise StepFailed(f"simplify: onnx-simplifier failed: {reason}: try skip_fuse_bn: true, or {WITHOUT}")
        save(model, dst)
        try:
            session(dst)
        except Exception as err:
            raise StepFailed(f"simplify: onnx-simplifier failed: its result does not load in onnxruntime: "
                             f"{first_line(err).rstrip('.')}; {WITHOUT}") from err
