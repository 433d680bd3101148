"""Fix shapes: make symbolic dims concrete, by dim name or per input, then re-infer shapes.

Users cannot see the symbolic dim names inside an exported model, so every error lists
what the model actually has. Fixing only some dims (say `batch`) is allowed.
"""

from __future__ import annotations

from pathlib import Path

import onnx
from onnxruntime.tools.onnx_model_utils import make_dim_param_fixed, make_input_shape_fixed

from pipeline.errors import OptionError, StepFailed, first_line
from pipeline.onnx_io import dims, load_structure, save
from pipeline.recipe import FixShapesOptions
from pipeline.steps.base import Step, StepContext

Shape = list[int | str | None]


def _show(shape: Shape) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def _symbolic(shapes: dict[str, Shape]) -> list[str]:
    return sorted({d for shape in shapes.values() for d in shape if isinstance(d, str)})


def _check_input(name: str, given: list[int], have: Shape, bound: dict[str, tuple[int, str]]) -> None:
    """Check one per-input shape against the model and against values other options give the same dim."""
    key = f"inputs.{name}"
    if len(given) != len(have):
        raise OptionError(key, f"{given} has rank {len(given)} but input '{name}' is {_show(have)} (rank {len(have)})")
    for axis, (value, dim) in enumerate(zip(given, have)):
        if isinstance(dim, int) and dim > 0 and value != dim:
            raise OptionError(key, f"axis {axis} of '{name}' is fixed at {dim} in the model ({_show(have)}), not {value}")
        if isinstance(dim, str):
            earlier, where = bound.setdefault(dim, (value, key))
            if earlier != value:
                raise OptionError(key, f"axis {axis} of '{name}' is dim '{dim}', which {where} sets to {earlier}, not {value}")


class FixShapes(Step[FixShapesOptions]):
    name = "fix_shapes"

    def validate(self, model: onnx.ModelProto, options: FixShapesOptions) -> None:
        shapes = dims(model)
        symbolic = _symbolic(shapes)
        for dim in options.dims:
            if dim not in symbolic:
                inputs = ", ".join(f"{name} {_show(shape)}" for name, shape in shapes.items())
                have = ", ".join(symbolic) if symbolic else f"none (inputs: {inputs})"
                raise OptionError(f"dims.{dim}", f"no input has a dim named '{dim}'; symbolic dims in this model: {have}")
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
                make_dim_param_fixed(model.graph, dim, value)
            for name, shape in options.inputs.items():
                make_input_shape_fixed(model.graph, name, shape)
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
