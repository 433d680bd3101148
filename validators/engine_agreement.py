"""The same file on two engines: where a model's outputs on one engine disagree with its outputs on another
beyond the recipe's fidelity budget, the numbers belong to the engine, not to the model.

NNCF's ONNX-path INT8 of YOLOv8n computes class scores with cosine 0.979 to FP32 on ONNX Runtime and 0.038 on
OpenVINO (the same file): each pair is gated on its own outputs, so the OpenVINO pair fails, but a reader of
report.json should also learn that the two engines compute that file differently, before serving it on
either. Each model evaluated on two or more engines is compared engine against engine (its first engine's
outputs as the reference) with the recipe's own fidelity bounds (whole outputs, worst rows, slices; without a
fidelity section, DEFAULT_COSINE on whole outputs and rows).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from temper.validators.fidelity import compare_outputs, fidelity_gates
from temper.validators.report_model import EngineDisagreement
from temper.validators.spec import FidelityGate, ValidateSpec

DEFAULT_COSINE = 0.99  # the agreement two engines must show on one file when the recipe sets no fidelity bound


def disagreements(outputs: Mapping[tuple[str, str], dict[str, np.ndarray]],
                  spec: ValidateSpec) -> list[EngineDisagreement]:
    """One record per (model, other engine) whose outputs miss the budget against the model's first engine's;
    `outputs`: (model, engine) -> outputs over the evaluation set, in the order they were evaluated."""
    if spec.fidelity is None or (spec.fidelity.cosine_min is None and spec.fidelity.row_bound is None
                                 and spec.fidelity.atol is None and spec.fidelity.rel_l2_max is None):
        slices = spec.fidelity.slices if spec.fidelity else []
        spec = spec.model_copy(update={"fidelity": FidelityGate(cosine_min=DEFAULT_COSINE, slices=slices)})
    engines: dict[str, list[str]] = {}
    for model, engine in outputs:
        engines.setdefault(model, []).append(engine)
    found = []
    for model, seen in engines.items():
        first = seen[0]
        for other in seen[1:]:
            comparisons = compare_outputs(outputs[(model, first)], outputs[(model, other)], spec)
            missed = [g.detail for g in fidelity_gates(comparisons, spec) if not g.passed]
            if missed:
                found.append(EngineDisagreement(model=model, engine=first, other=other, missed=missed,
                                                comparisons=comparisons))
    return found


def describe(found: EngineDisagreement) -> str:
    """One line for the console and report.md."""
    return (f"{found.model} computes differently on {found.other} than on {found.engine} (the same file, outputs "
            f"compared engine against engine): {'; '.join(found.missed)}")
