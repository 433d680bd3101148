"""validate.fidelity.slices against the baseline's real output shapes, before anything is built or gated:
a slice past the end of its axis would otherwise gate nothing, or fail deep inside validation."""

from __future__ import annotations

from pathlib import Path

from temper.artifacts.core import onnx_io
from temper.artifacts.core.errors import RecipeError
from temper.pipeline.runner import Runner
from temper.validators.fidelity import Shape, row_scales, slice_problem

SCALE_GAP = 100.0  # rows whose RMS differ by this factor or more: one cosine over them sees only the large ones


def output_shapes(runner: Runner, baseline: Path, axes: set[tuple[str, int]]) -> dict[str, Shape]:
    """The baseline's output dims as its graph declares them, samples first (each output's batch axis moved
    to the front, as validation compares them); where an axis a slice cuts is not fixed there, the dims
    of a real run on the sample batch."""
    graph = onnx_io.load_structure(baseline).graph
    layout = runner.layout(baseline)
    shapes: dict[str, Shape] = {o.name: _first(layout.outputs.get(o.name, 0), [
        d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in o.type.tensor_type.shape.dim])
        for o in graph.output}
    open_axes = [(name, axis) for name, axis in axes
                 if name in shapes and axis < len(shapes[name]) and not isinstance(shapes[name][axis], int)]
    if open_axes or any(name in shapes and not shapes[name] for name, _ in axes):
        ran = onnx_io.run(baseline, runner.sample(), layout)
        shapes = {name: list(value.shape) for name, value in
                  layout.samples({o.name: v for o, v in zip(graph.output, ran, strict=True)}).items()}
    return shapes


def _first(axis: int | None, shape: Shape) -> Shape:
    """`shape` with its batch axis first."""
    return shape if not axis or axis >= len(shape) else [shape[axis], *shape[:axis], *shape[axis + 1:]]


def check_slices(runner: Runner, baseline: Path | None = None) -> list[str]:
    """Raise RecipeError (exit 2) at the slice's key when it does not fit the baseline (default: the one
    the runner builds, from the cache); return what was checked."""
    spec = runner.recipe.validation
    parts = spec.fidelity.slices if spec is not None and spec.fidelity is not None else []
    if not parts:
        return []
    baseline = baseline or runner.baseline()[-1].path
    shapes = output_shapes(runner, baseline, {(p.output, p.axis) for p in parts})
    for index, part in enumerate(parts):
        problem = slice_problem(part, shapes)
        if problem is not None:
            key, message = problem
            raise RecipeError(runner.loaded.file, f"validate.fidelity.slices[{index}].{key}", message)
    return [f"validate.fidelity.slices: {', '.join(p.label for p in parts)} fit the baseline's outputs"]


def mixed_scale_notices(runner: Runner, baseline: Path | None = None) -> list[str]:
    """One line per output whose rows (indices of its leading non-batch axis) differ in scale by SCALE_GAP or
    more on a real batch of the baseline, naming the small rows and the slice that gates them on their own."""
    if runner.recipe.data.evaluation is None and runner.recipe.data.calibration is None:
        return []
    baseline = baseline or runner.baseline()[-1].path
    layout = runner.layout(baseline)
    graph = onnx_io.load_structure(baseline).graph
    ran = onnx_io.run(baseline, runner.sample(), layout)
    outputs = layout.samples({o.name: v for o, v in zip(graph.output, ran, strict=True)})
    spec = runner.recipe.validation
    bound = spec.fidelity.cosine_min if spec is not None and spec.fidelity is not None else None
    notices = []
    for name, value in outputs.items():
        scales = row_scales(value)
        if scales is None or not (scales > 0).any():
            continue
        live = scales[scales > 0]
        if live.max() / live.min() < SCALE_GAP:
            continue
        small = [int(i) for i in range(len(scales)) if scales[i] * SCALE_GAP <= live.max()]
        start, stop = small[0], small[-1] + 1
        runs = "" if stop - start == len(small) else f" (and {stop - start - len(small)} larger rows between)"
        notices.append(
            f"output '{name}': its {len(scales)} rows along axis 1 differ in scale by {live.max() / live.min():,.0f}x "
            f"(rows {start}-{stop - 1} have RMS up to {scales[small].max():.3g}, others up to {live.max():.3g}){runs}: "
            "a whole-output cosine sees only the large rows. The worst-row gate (validate.fidelity.row_cosine_min, "
            "default cosine_min) checks each row; to gate the small rows as one part, add "
            f"validate.fidelity.slices: [{{output: {name}, axis: 1, start: {start}, stop: {stop}, "
            f"cosine_min: {bound if bound is not None else 0.99}}}]")
    return notices
