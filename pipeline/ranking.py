"""`temper sensitivity`: the SQNR ranking of a candidate's static quantize step, without tuning.

The command's side only: it finds the candidate's step and builds what comes before it through the
runner; the ranking itself is the quantize step's (pipeline/steps/quantize/sensitivity.py). It stays
out of pipeline/steps/ because it drives the Runner, which imports the steps.
"""

from __future__ import annotations

import contextlib
import io

from temper.artifacts.core import onnx_io
from temper.artifacts.core.errors import RecipeError
from temper.pipeline.cache import RangeStore
from temper.pipeline.quantize_backends import OrtOptions, quantize_static
from temper.pipeline.runner import Runner
from temper.pipeline.step_options import FallbackOptions
from temper.pipeline.steps.quantize import Quantize, calibration_feeds, needs_external_data, rankable, sensitivity
from temper.pipeline.steps.quantize.fallback import first_samples


def rank_candidate(runner: Runner, name: str, samples: int | None) -> list[sensitivity.NodeSensitivity]:
    """Build the candidate's steps before its static quantize step (cached), calibrate, and rank."""
    recipe, file = runner.recipe, runner.loaded.file
    if name not in recipe.candidates:
        trials = runner.loaded.searches.get(name)
        hint = (f"it is a search: name one of its trials ({', '.join(trials.trials)})" if trials
                else f"candidates: {', '.join(recipe.candidates)}")
        raise RecipeError(file, "--candidate", f"no candidate named '{name}'; {hint}")
    steps = recipe.candidates[name].steps
    index = next((i for i, s in enumerate(steps)
                  if s.name == Quantize.name and rankable(s.options)), None)
    if index is None:
        raise RecipeError(file, f"candidates.{name}.steps", "has no static quantize step (mode: static, backend: ort): "
                                                           "the ranking measures what static INT8 does to each node")
    options = steps[index].options
    assert isinstance(options, OrtOptions)
    base = runner.baseline()
    source = runner.chain(name, base[-1], steps[:index], f"candidates.{name}.steps")[-1].path
    structure = onnx_io.load_structure(source)
    feeds = calibration_feeds(structure, runner.calibration_batches, runner.input_layout)
    count = samples or (options.fallback or FallbackOptions()).samples
    with contextlib.redirect_stdout(io.StringIO()):  # the quantizer's progress prints
        prepared = quantize_static.prepare(source, options, feeds, runner.scratch, needs_external_data(structure),
                                           RangeStore.beside(runner.cache))
        return sensitivity.rank(prepared, options, first_samples(feeds, count, runner.input_layout), runner.scratch,
                                progress=runner.observer.note)
