"""`model.inputs` against the model and the data, before anything is built on them.

`check_graph` holds the declared inputs and outputs to an ONNX file's graph. Data holds one row per
sample, samples first, whatever axis the model holds them on: temper moves each input's samples to
its `batch_axis` when it forms a batch, and adds the constant inputs (a `value` in the recipe).
`as_declared` checks each input's rows against its declared shape without the batch axis;
`check_batch` runs the baseline on one real batch laid out that way, so a layout the model does not
take is one line naming the input at `temper check` (and before `temper run` builds anything), never
a run that gates models on batches they cannot take. The same runs find each output's batch axis:
the one axis that grows with the samples, from a batch of 2 to one of 3.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

from temper.artifacts.core import onnx_io
from temper.artifacts.core.errors import OptionError, RecipeError, first_line
from temper.artifacts.core.layout import Layout
from temper.pipeline.recipe import InputSpec, ModelSpec


def check_graph(model: onnx.ModelProto, spec: ModelSpec, name: str, file: str) -> None:
    """Refuse declared inputs and outputs an ONNX model (`name`) does not have, in another shape, or short
    of one it takes."""
    real_inputs = onnx_io.dims(model)
    for i, declared in enumerate(spec.inputs):
        if declared.name not in real_inputs:
            raise RecipeError(file, f"model.inputs[{i}].name",
                              f"'{declared.name}' is not an input of {name}; its inputs: {', '.join(real_inputs)}")
    for i, declared in enumerate(spec.inputs):
        real = real_inputs[declared.name]
        clash = [(a, d, r) for a, (d, r) in enumerate(zip(declared.shape, real))
                 if isinstance(d, int) and isinstance(r, int) and r > 0 and d != r]
        if len(real) != len(declared.shape) or clash:
            scalar = " (a scalar: shape: [] with the value it takes, e.g. value: 16000)" if not real else ""
            raise RecipeError(file, f"model.inputs[{i}].shape", f"declared {declared.shape}, but {name} takes "
                                                                f"'{declared.name}' as {real}: declare the model's "
                                                                f"shape{scalar}")
    undeclared = [n for n in real_inputs if n not in {i.name for i in spec.inputs}]
    if undeclared:
        raise RecipeError(file, "model.inputs", f"{name} also takes '{undeclared[0]}': declare every input")
    real_outputs = [o.name for o in model.graph.output]
    for i, output in enumerate(spec.outputs):
        if output not in real_outputs:
            raise RecipeError(file, f"model.outputs[{i}]",
                              f"'{output}' is not an output of {name}; its outputs: {', '.join(real_outputs)}")


def as_declared(file: str, index: int, spec: InputSpec, values: np.ndarray, which: str) -> np.ndarray:
    """The data for one input in its declared dtype, refused (with both keys named) when the data
    cannot be that dtype without losing what it says, or its rows have another rank or fixed dim than
    the declared shape without its batch axis."""
    key = f"model.inputs[{index}]"
    given = np.asarray(values)
    if given.dtype.kind in "OUSV":
        what = "text" if given.dtype.kind in "US" else f"{given.dtype} (not numeric)"
        raise RecipeError(file, f"data.{which}",
                          f"input '{spec.name}' gets {what} data, but {key} is {spec.dtype}: "
                          "add a preprocess callable that turns it into numbers (e.g. a tokenizer)")
    wanted = np.dtype(spec.dtype)
    if wanted.kind in "iub" and given.dtype.kind == "f" and not np.array_equal(given, np.round(given)):
        raise RecipeError(file, f"{key}.dtype",
                          f"'{spec.name}' is declared {spec.dtype}, but data.{which} holds "
                          f"fractional {given.dtype} values: declare float32, or fix the data")
    shape, row = list(given.shape), [d for axis, d in enumerate(spec.shape) if axis != spec.batch_axis]
    sample = f"each sample is {row}" + (f" (batch_axis {spec.batch_axis} left out)" if spec.batch_axis else "")
    if len(shape) != len(spec.shape):
        raise RecipeError(file, f"{key}.shape", f"'{spec.name}' is declared with {len(spec.shape)} dims "
                                                f"{spec.shape}, so {sample}, but data.{which} rows have shape "
                                                f"{shape[1:]} ({len(shape)} dims with the sample dim)")
    for axis, (declared, real) in enumerate(zip(row, shape[1:]), 1):
        if isinstance(declared, int) and declared != real:
            raise RecipeError(file, f"{key}.shape",
                              f"'{spec.name}' is declared {spec.shape}, so {sample}, but data.{which} "
                              f"has {real} at axis {axis}: fix the declared shape or the data")
    return given.astype(wanted, copy=False)


def check_batch(path: Path, layout: Layout, rows: dict[str, np.ndarray], where: str,
                inputs: list[InputSpec], file: str) -> Layout:
    """Run the model at `path` on `rows` (one real batch, samples first) laid out by `layout`, and on 2
    and 3 of its samples; `layout` with each output's batch axis. A feed the model does not take is a
    RecipeError naming the input (`where` names the data set)."""
    model = onnx_io.load_structure(path)
    graph = onnx_io.dims(model)
    at_batch = {graph[n][a] for n, a in layout.inputs.items() if a is not None and a < len(graph.get(n, []))}
    fixed = onnx_io.fixed_batch(model, layout) if len(at_batch) == 1 else None  # the same on every batch axis
    count = max(len(next(iter(rows.values()))), fixed or 0)  # a fixed batch past the sample: rows repeat
    feed = layout.feed(_repeat(rows, count))
    for index, spec in enumerate(inputs):
        _fits(spec, index, list(feed[spec.name].shape), graph.get(spec.name, []), count, fixed, path.name, file)
    _agree(inputs, graph, path.name, file)  # where the count happens to fit a fixed axis that is not the batch
    session = onnx_io.session(path)
    names = [o.name for o in session.get_outputs()]

    def run(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        try:
            return dict(zip(names, session.run(names, onnx_io.fit_batch(model, batch, layout))))
        except OptionError as exc:
            raise RecipeError(file, where, f"input {exc.message}") from None
        except Exception as exc:  # onnxruntime's errors share no base class
            raise RecipeError(file, where, f"the baseline does not run on a batch of {layout.rows(batch)} samples "
                                           f"laid out as model.inputs says: {first_line(exc)}") from exc

    first = run(feed)
    if fixed is not None:  # a fixed batch: only one batch size runs, outputs hold their rows on axis 0
        if fixed > 1:
            reversed_ = run(layout.feed({name: array[::-1] for name, array in _repeat(rows, fixed).items()}))
            _holds_samples(inputs, graph, fixed, first, reversed_, path.name, file)
        return layout
    small, large = (run(layout.feed(_repeat(rows, k))) for k in (2, 3))
    return layout.with_outputs({name: _output_axis(name, list(small[name].shape), list(large[name].shape), file)
                                for name in names})


def _repeat(rows: dict[str, np.ndarray], count: int) -> dict[str, np.ndarray]:
    """`count` samples of `rows`, in order, repeated where it has fewer."""
    return {name: array[np.arange(count) % len(array)] for name, array in rows.items()}


def _fits(spec: InputSpec, index: int, got: list[int], want: list[int | str | None], count: int,
          fixed: int | None, model: str, file: str) -> None:
    """Refuse a feed whose fixed dims differ from the model's; on the batch axis only where the model does
    not fix its batch (the same size on every input's batch axis, which fit_batch cuts the batch to)."""
    axis = spec.batch_axis
    if len(got) == len(want) and all(g == w for a, (g, w) in enumerate(zip(got, want))
                                     if isinstance(w, int) and w > 0 and not (a == axis and w == fixed)):
        return
    if axis is None:
        raise RecipeError(file, f"model.inputs[{index}].value",
                          f"'{spec.name}' is the constant {spec.value!r} of shape {got}, but {model} takes {want}")
    open_axes = [a for a, w in enumerate(want) if not (isinstance(w, int) and w > 0)]
    hint = (f"set model.inputs[{index}].batch_axis: {open_axes[0]}" if len(open_axes) == 1 and open_axes[0] != axis
            else "set its batch_axis to the axis of the model's shape that holds the samples")
    raise RecipeError(file, f"model.inputs[{index}].batch_axis",
                      f"'{spec.name}': a batch of {count} samples on batch_axis {axis} is {got}, but {model} "
                      f"takes {want}: {hint} (data rows stay samples first; temper moves them there)")


def _agree(inputs: list[InputSpec], graph: dict[str, list[int | str | None]], model: str, file: str) -> None:
    """Refuse batch axes that hold a fixed dim where another input's batch axis holds another dim: the
    samples of one batch are the same count on every input, so a fixed one must be that count everywhere."""
    at = []
    for index, spec in enumerate(inputs):
        want = graph.get(spec.name, [])
        if spec.batch_axis is not None:
            at.append((index, spec, want[spec.batch_axis] if spec.batch_axis < len(want) else None))
    if len({dim for _, _, dim in at}) < 2 or not any(isinstance(dim, int) and dim > 0 for _, _, dim in at):
        return
    index, spec, dim = next((i, s, d) for i, s, d in at if isinstance(d, int) and d > 0)  # a symbolic one takes any
    other, other_dim = next((s, d) for _, s, d in at if d != dim)
    raise RecipeError(file, f"model.inputs[{index}].batch_axis",
                      f"'{spec.name}': batch_axis {spec.batch_axis} is {dim!r} in {model}, but '{other.name}' holds "
                      f"the samples on a dim {other_dim!r}: a batch holds as many samples on every input, so "
                      f"{_where(spec, index, graph.get(spec.name, []))}")


def _holds_samples(inputs: list[InputSpec], graph: dict[str, list[int | str | None]], fixed: int,
                   first: dict[str, np.ndarray], reversed_: dict[str, np.ndarray], model: str, file: str) -> None:
    """Refuse a fixed batch axis the model does not treat as samples: with its samples reversed, each output
    that changes must come back with its rows reversed on an axis of `fixed` rows. A fixed dim of some other
    meaning (features, channels) named as batch_axis fails this: the model then mixes the "samples"."""
    for name, out in first.items():
        again = reversed_[name]
        if _close(out, again) or any(out.shape[axis] == fixed and _close(np.flip(out, axis), again)
                                     for axis in range(out.ndim)):
            continue
        index, spec = next((i, s) for i, s in enumerate(inputs) if s.batch_axis is not None)
        raise RecipeError(file, f"model.inputs[{index}].batch_axis",
                          f"'{spec.name}': batch_axis {spec.batch_axis} is {model}'s fixed dim {fixed}, but the "
                          f"baseline does not treat it as {fixed} samples (with their order reversed, output "
                          f"'{name}' {list(out.shape)} does not come back with its rows reversed), so "
                          f"{_where(spec, index, graph.get(spec.name, []))}")


def _where(spec: InputSpec, index: int, want: list[int | str | None]) -> str:
    """How to name the axis that holds the samples."""
    open_axes = [a for a, w in enumerate(want) if not (isinstance(w, int) and w > 0)]
    if len(open_axes) == 1 and open_axes[0] != spec.batch_axis:
        return f"set model.inputs[{index}].batch_axis: {open_axes[0]} (the axis {want} leaves open)"
    return "set its batch_axis to the axis of the model's shape that holds the samples"


def _close(a: np.ndarray, b: np.ndarray) -> bool:
    """The same output up to float noise (a batch's composition may move the last bits)."""
    if a.shape != b.shape:
        return False
    if a.dtype.kind not in "biufc":
        return bool(np.array_equal(a, b))
    a, b = a.astype(np.float64), b.astype(np.float64)
    scale = float(np.abs(a).max()) if a.size else 0.0
    return bool(np.allclose(a, b, rtol=1e-4, atol=1e-6 * max(scale, 1.0)))


def _output_axis(name: str, small: list[int], large: list[int], file: str) -> int:
    """The one axis of an output that goes from 2 to 3 when the samples do."""
    grew = [a for a, (s, big) in enumerate(zip(small, large)) if s != big]
    if len(small) == len(large) and len(grew) == 1 and (small[grew[0]], large[grew[0]]) == (2, 3):
        return grew[0]
    raise RecipeError(file, "model.outputs",
                      f"output '{name}' is {small} for 2 samples and {large} for 3: temper gates and serves outputs "
                      "with one row per sample on one axis, and cannot tell which holds them here")
