"""Fix shapes: make symbolic dims concrete, by dim name or per input, then re-infer shapes.

Users cannot see the symbolic dim names inside an exported model, so every error lists
what the model actually has. Fixing only some dims (say `batch`) is allowed. A per-input shape
sets each axis: a dim name it gives one value everywhere is fixed across the graph, while an
unnamed dim ('?', what many exporters write) or a name given different values on different axes
is set on that axis alone (an OCR input [-1, 3, '?', '?'] can become [1, 3, 48, 192]).
"""

from __future__ import annotations

from pathlib import Path

import onnx

from temper.artifacts.core.errors import OptionError, StepFailed, first_line
from temper.artifacts.core.onnx_io import dims, load_structure, save
from temper.pipeline.step_options import FixShapesOptions
from temper.pipeline.steps.base import Step, StepContext

Shape = list[int | str | None]
UNNAMED = "?"  # exporters' placeholder for a dim with no name: it links nothing


def _show(shape: Shape) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def _per_axis_example(shapes: dict[str, Shape]) -> str:
    """`inputs: {NAME: [...]}` for this model's first input with a '?' dim (else its first input): its
    real name and rank, fixed dims as they are, every other one a placeholder to fill in."""
    name = next((n for n, shape in shapes.items() if UNNAMED in shape or None in shape), next(iter(shapes), "x"))
    axes = ", ".join(str(d) if isinstance(d, int) else "N" for d in shapes.get(name, []))
    return f"inputs: {{{name}: [{axes}]}} with each N the size you serve"


def _symbolic(shapes: dict[str, Shape]) -> list[str]:
    return sorted({d for shape in shapes.values() for d in shape if isinstance(d, str)})


def _check_input(name: str, given: list[int], have: Shape, bound: dict[str, tuple[int, str]]) -> None:
    """Check one per-input shape against the model and against values other options give the same dim."""
    key = f"inputs.{name}"
    if len(given) != len(have):
        raise OptionError(key, f"{given} has rank {len(given)} but input '{name}' is {_show(have)} (rank {len(have)})")
    for axis, (value, dim) in enumerate(zip(given, have)):
        if isinstance(dim, int) and dim > 0 and value != dim:
            raise OptionError(key,
                              f"axis {axis} of '{name}' is fixed at {dim} in the model ({_show(have)}), not {value}")
        if isinstance(dim, str) and dim in bound:
            earlier, where = bound[dim]
            if earlier != value:
                raise OptionError(key, f"axis {axis} of '{name}' is dim '{dim}', "
                                       f"which {where} sets to {earlier}, not {value}")


class FixShapes(Step[FixShapesOptions]):
    name = "fix_shapes"
    options_model = FixShapesOptions

    def validate(self, model: onnx.ModelProto, options: FixShapesOptions) -> None:
        shapes = dims(model)
        symbolic = _symbolic(shapes)
        for dim in options.dims:
            if dim == UNNAMED:
                raise OptionError(f"dims.{dim}", "'?' is the placeholder for dims without a name, not a name: set "
                                                 f"them per axis with inputs, e.g. {_per_axis_example(shapes)}")
            if dim not in symbolic:
                inputs = ", ".join(f"{name} {_show(shape)}" for name, shape in shapes.items())
                have = ", ".join(symbolic) if symbolic else f"none (inputs: {inputs})"
                raise OptionError(f"dims.{dim}",
                                  f"no input has a dim named '{dim}'; symbolic dims in this model: {have}")
        bound = {dim: (value, f"dims.{dim}") for dim, value in options.dims.items()}
        for name, given in options.inputs.items():
            if name not in shapes:
                raise OptionError(f"inputs.{name}", f"no model input named '{name}'; inputs: {', '.join(shapes)}")
            _check_input(name, given, shapes[name], bound)

    def run(self, src: Path, dst: Path, options: FixShapesOptions, ctx: StepContext) -> None:
        # Work on the graph alone: shape inference on a model with weights inline fails past 2 GB.
        model = load_structure(src)
        try:
            for dim, value in options.dims.items():
                _fix_dim(model.graph, dim, value)
            shared = _shared_names(model, options)
            for name, shape in options.inputs.items():
                _fix_input(model.graph, name, shape, shared)
            _forget_negative_dims(model.graph)
        except ValueError as err:
            raise StepFailed(f"fix_shapes: {err}") from err
        try:
            # Propagates the new sizes to outputs and value_info; strict mode turns a size
            # the graph contradicts (a hard-coded Reshape, a Gemm width) into an error here.
            model = onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
        except onnx.shape_inference.InferenceError as err:
            raise StepFailed(f"fix_shapes: the model contradicts the fixed shapes: {first_line(err)}") from err
        self._check_fixed(model, options)
        onnx.load_external_data_for_model(model, str(src.parent))
        save(model, dst)

    @staticmethod
    def _check_fixed(model: onnx.ModelProto, options: FixShapesOptions) -> None:
        """Every dim the options name must now be concrete on every input (others may stay symbolic)."""
        for name, shape in dims(model).items():
            open_dims = [d for d in shape if not isinstance(d, int) and (name in options.inputs or d in options.dims)]
            if open_dims:
                raise StepFailed(f"fix_shapes: input '{name}' is still {_show(shape)} after fixing")


def _shared_names(model: onnx.ModelProto, options: FixShapesOptions) -> dict[str, int]:
    """Dim names the per-input shapes give a single value (so they are fixed graph-wide)."""
    values: dict[str, set[int]] = {}
    shapes = dims(model)
    for name, given in options.inputs.items():
        for value, dim in zip(given, shapes[name]):
            if isinstance(dim, str) and dim != UNNAMED:
                values.setdefault(dim, set()).add(value)
    return {dim: found.pop() for dim, found in values.items() if len(found) == 1}


def _fix_input(graph: onnx.GraphProto, name: str, shape: list[int], shared: dict[str, int]) -> None:
    value = next(v for v in graph.input if v.name == name)
    for dim, size in zip(value.type.tensor_type.shape.dim, shape):
        if dim.HasField("dim_param") and dim.dim_param in shared:
            _fix_dim(graph, dim.dim_param, size)  # every input and output that shares the name
        elif not dim.HasField("dim_value") or dim.dim_value <= 0:  # some exporters write -1 for "any"
            dim.Clear()
            dim.dim_value = size


def _fix_dim(graph: onnx.GraphProto, name: str, size: int) -> None:
    """ONNX Runtime's make_dim_param_fixed, imported here: onnxruntime.tools imports torch."""
    from onnxruntime.tools.onnx_model_utils import make_dim_param_fixed

    make_dim_param_fixed(graph, name, size)


def _forget_negative_dims(graph: onnx.GraphProto) -> None:
    """A -1 some exporters write for "any size" is not a size: make it unknown, so shape inference
    fills in the fixed value instead of calling it a contradiction."""
    for value in [*graph.output, *graph.value_info]:
        for dim in value.type.tensor_type.shape.dim:
            if dim.HasField("dim_value") and dim.dim_value < 0:
                dim.Clear()
