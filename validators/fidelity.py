"""Per-output numeric comparison in Polygraphy's vocabulary: abs/rel error statistics and cosine, on whole
outputs and on the slices a recipe names (a mixed-scale output's small part, gated on its own).

A whole-output cosine is dominated by the output's largest values: YOLOv8n's [batch, 22, 2100] holds 4 box
rows in pixels beside 18 class-score rows in [0, 1], and an INT8 model whose class scores have cosine 0.04
still scores 0.993 whole. So every whole output whose leading non-batch axis is small (at most MAX_ROWS) is
also compared index by index along it, and its worst row is gated on `row_cosine_min` (default: the
recipe's `cosine_min`): a default that mixed scales cannot hide."""

from __future__ import annotations

import numpy as np

from temper.validators.gates import Gate, at_least, at_most
from temper.validators.report_model import Comparison, OutputSlice, WorstRow
from temper.validators.spec import FidelityGate, FidelitySlice, ValidateSpec

Shape = list[int | str | None]  # an output's dims: fixed, symbolic, or unknown
MAX_ROWS = 256  # a leading non-batch axis up to this size is compared index by index (4 + 80 classes fits)


def row_scales(reference: np.ndarray) -> np.ndarray | None:
    """The RMS of each index of the leading non-batch axis of a samples-first output (None: no such small axis)."""
    ref = np.asarray(reference, dtype=np.float64)
    if ref.ndim < 2 or not 2 <= ref.shape[1] <= MAX_ROWS or ref.size == 0:
        return None
    rows = np.moveaxis(ref, 1, 0).reshape(ref.shape[1], -1)
    return np.sqrt(np.mean(rows * rows, axis=1))


def worst_row(reference: np.ndarray, candidate: np.ndarray) -> WorstRow | None:
    """The index of the leading non-batch axis whose values (over every sample and position) agree least with
    the baseline's by cosine. A row the baseline holds only zeros in has no direction and is left out;
    None when the axis is not small or no row has a direction."""
    scales = row_scales(reference)
    if scales is None:
        return None
    count = np.shape(reference)[1]
    a = np.moveaxis(np.asarray(reference, dtype=np.float64), 1, 0).reshape(count, -1)
    b = np.moveaxis(np.asarray(candidate, dtype=np.float64), 1, 0).reshape(count, -1)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    informative = np.linalg.norm(a, axis=1) > 0
    if not informative.any():
        return None
    with np.errstate(invalid="ignore", divide="ignore"):
        cosines = np.where(norms > 0, np.sum(a * b, axis=1) / np.where(norms > 0, norms, 1.0), 0.0)
    cosines = np.where(np.isfinite(cosines), cosines, 0.0)  # a NaN/Inf row agrees in nothing (its gate fails too)
    index = int(np.argmin(np.where(informative, cosines, np.inf)))
    live = scales[informative]
    return WorstRow(axis=1, rows=count, index=index, cosine=float(cosines[index]),
                    spread=float(live.max() / live.min()) if live.min() > 0 else float("inf"))


def compare(name: str, reference: np.ndarray, candidate: np.ndarray, atol: float, rtol: float,
            rows: bool = False) -> Comparison:
    """Compare one output; `within_tolerance` follows numpy.allclose (|c - r| <= atol + rtol*|r|); `rows`: its
    worst row too (worst_row)."""
    ref = np.asarray(reference, dtype=np.float64)
    got = np.asarray(candidate, dtype=np.float64)
    if ref.shape != got.shape:
        raise ValueError(f"output '{name}': shapes differ, {list(ref.shape)} vs {list(got.shape)}")
    nonfinite = int(np.size(got) - np.count_nonzero(np.isfinite(got)))
    err = np.abs(got - ref)
    rel = err / np.maximum(np.abs(ref), 1e-12)
    a, b = ref.ravel(), got.ravel()
    norm = float(np.linalg.norm(a) * np.linalg.norm(b))
    cosine = float(np.dot(a, b) / norm) if norm > 0 else float(np.array_equal(a, b))
    ref_norm = float(np.linalg.norm(a))
    rel_l2 = float(np.linalg.norm(b - a) / ref_norm) if ref_norm > 0 else float(not np.array_equal(a, b))
    finite = nonfinite == 0
    return Comparison(
        name=name,
        slice=None,
        max_abs=float(err.max()) if err.size else 0.0,
        mean_abs=float(err.mean()) if err.size else 0.0,
        p99_abs=float(np.percentile(err, 99)) if err.size else 0.0,
        max_rel=float(rel.max()) if rel.size else 0.0,
        rel_l2=rel_l2,
        cosine=cosine,
        nonfinite=nonfinite,
        within_tolerance=finite and bool(np.allclose(got, ref, atol=atol, rtol=rtol)),
        worst_row=worst_row(ref, got) if rows else None,
    )


def slice_problem(part: FidelitySlice, shapes: dict[str, Shape]) -> tuple[str, str] | None:
    """(key under the slice, message) when `part` does not fit the baseline's output `shapes`, else None."""
    if part.output not in shapes:
        return "output", f"'{part.output}' is not an output of the baseline; its outputs: {', '.join(shapes)}"
    if part.name is not None and part.name in shapes:
        return "name", f"'{part.name}' is already an output's name, and gates are named by it: choose another name"
    shape = shapes[part.output]
    if part.axis >= len(shape):
        return "axis", (f"output '{part.output}' has {len(shape)} axes {shape}: axis {part.axis} does not exist "
                        f"(axes count from 0)")
    size = shape[part.axis]
    if not isinstance(size, int):
        return "axis", (f"axis {part.axis} of output '{part.output}' has no fixed size ({size!r}) in the baseline: "
                        "slice a fixed axis, or fix its shape with a fix_shapes step")
    if part.start >= size:
        return "start", f"start {part.start} is past axis {part.axis} of output '{part.output}', which has {size}"
    if part.stop is not None and part.stop > size:
        return "stop", (f"stop {part.stop} is past axis {part.axis} of output '{part.output}', which has {size} "
                        f"(stop is exclusive: at most {size})")
    return None


def compare_slice(part: FidelitySlice, reference: np.ndarray, candidate: np.ndarray) -> Comparison:
    """Compare `start:stop` along `axis` of one output, named by the slice."""
    problem = slice_problem(part, {part.output: list(np.shape(reference))})
    if problem is not None:
        raise ValueError(f"validate.fidelity slice '{part.label}': {problem[1]}")
    stop = part.stop if part.stop is not None else np.shape(reference)[part.axis]
    index = (slice(None),) * part.axis + (slice(part.start, stop),)
    result = compare(part.label, np.asarray(reference)[index], np.asarray(candidate)[index], atol=0.0, rtol=0.0)
    return result.model_copy(update={"slice": OutputSlice(output=part.output, axis=part.axis, start=part.start,
                                                          stop=stop)})


def compare_outputs(reference: dict[str, np.ndarray], candidate: dict[str, np.ndarray],
                    spec: ValidateSpec) -> list[Comparison]:
    """Every output of `reference` whole, then every slice the recipe names (what fidelity_gates reads)."""
    whole = [compare(name, reference[name], candidate[name], atol=0.0, rtol=0.0, rows=True) for name in reference]
    parts = spec.fidelity.slices if spec.fidelity else []
    return whole + [compare_slice(p, reference[p.output], candidate[p.output]) for p in parts]


def fidelity_gates(comparisons: list[Comparison], spec: ValidateSpec) -> list[Gate]:
    """NaN/Inf per output, the recipe's cosine / atol / rel_l2 bounds per output, its row_cosine_min (default:
    cosine_min) on each output's worst row, and each slice's own bounds (also what the quantize fallback aims at)."""
    fidelity = spec.fidelity
    parts = {p.label: p for p in fidelity.slices} if fidelity else {}
    gates = []
    for c in comparisons:
        bounds: FidelityGate | FidelitySlice | None
        if c.slice is None:
            gates.append(Gate(f"fidelity.{c.name}.finite", c.nonfinite == 0, float(c.nonfinite), 0.0,
                              f"{c.nonfinite} NaN/Inf values" if c.nonfinite else "all values finite",
                              kind="fidelity"))
            bounds = fidelity
        else:
            bounds = parts[c.name]
        if bounds is None:
            continue
        what = "" if c.slice is None else f" of {c.slice.output}[axis {c.slice.axis}: {c.slice.start}:{c.slice.stop}]"
        if bounds.cosine_min is not None:
            gates.append(at_least("fidelity", f"fidelity.{c.name}.cosine", c.cosine, bounds.cosine_min,
                                  f"cosine to baseline{what}"))
        row_min = bounds.row_bound if isinstance(bounds, FidelityGate) else None
        if c.worst_row is not None and row_min is not None:
            row = c.worst_row
            gates.append(at_least("fidelity", f"fidelity.{c.name}.row_cosine", row.cosine, row_min,
                                  f"worst row cosine to baseline ({c.name}[axis {row.axis}] index {row.index} of "
                                  f"{row.rows})"))
        if bounds.atol is not None:
            gates.append(at_most("fidelity", f"fidelity.{c.name}.max_abs", c.max_abs, bounds.atol,
                                 f"max abs error{what}"))
        if bounds.rel_l2_max is not None:
            gates.append(at_most("fidelity", f"fidelity.{c.name}.rel_l2", c.rel_l2, bounds.rel_l2_max,
                                 f"relative L2 error{what}"))
    return gates
