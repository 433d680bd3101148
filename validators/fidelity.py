"""Per-output numeric comparison in Polygraphy's vocabulary: abs/rel error statistics and cosine."""

from __future__ import annotations

import numpy as np

from temper.pipeline.recipe import ValidateSpec
from temper.validators.gates import Gate, at_least, at_most
from temper.validators.report_model import Comparison


def compare(name: str, reference: np.ndarray, candidate: np.ndarray, atol: float, rtol: float) -> Comparison:
    """Compare one output; `within_tolerance` follows numpy.allclose (|c - r| <= atol + rtol*|r|)."""
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
    finite = nonfinite == 0
    return Comparison(
        name=name,
        max_abs=float(err.max()) if err.size else 0.0,
        mean_abs=float(err.mean()) if err.size else 0.0,
        p99_abs=float(np.percentile(err, 99)) if err.size else 0.0,
        max_rel=float(rel.max()) if rel.size else 0.0,
        cosine=cosine,
        nonfinite=nonfinite,
        within_tolerance=finite and bool(np.allclose(got, ref, atol=atol, rtol=rtol)),
    )


def fidelity_gates(comparisons: list[Comparison], spec: ValidateSpec) -> list[Gate]:
    """NaN/Inf per output, and the recipe's cosine / atol bounds (also what the quantize fallback aims at)."""
    gates = []
    for c in comparisons:
        gates.append(Gate(f"fidelity.{c.name}.finite", c.nonfinite == 0, float(c.nonfinite), 0.0,
                          f"{c.nonfinite} NaN/Inf values" if c.nonfinite else "all values finite"))
        if spec.fidelity and spec.fidelity.cosine_min is not None:
            gates.append(at_least(f"fidelity.{c.name}.cosine", c.cosine, spec.fidelity.cosine_min,
                                  "cosine to baseline"))
        if spec.fidelity and spec.fidelity.atol is not None:
            gates.append(at_most(f"fidelity.{c.name}.max_abs", c.max_abs, spec.fidelity.atol, "max abs error"))
    return gates
