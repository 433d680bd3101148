"""Gates on what a candidate's graph really is: its precision against the recipe's intent, and a
quantize fallback that could meet the budget only by leaving INT8 (its floor, tuning.json).

Both fail a candidate that would otherwise pass every gate as something it is not: an "int8-static"
candidate with no quantized node is the FP32 model under another name, and selecting or publishing it
as INT8 would be a lie. They are added only when they fail, so a true label costs no report line.
"""

from __future__ import annotations

from typing import Any

from temper.validators.census import Census
from temper.validators.gates import Gate

UNCHANGED = "fp32"  # pipeline.steps.UNCHANGED: the label of a candidate whose steps convert nothing


def truth_gates(census: Census, intended: str | None, tuning: dict[str, Any] | None) -> list[Gate]:
    gates = []
    actual = census.precision()
    # fp32 is what the registry says of steps that convert nothing: "as the input was", not a promise
    if intended not in (None, UNCHANGED) and actual != intended:
        gates.append(Gate("precision", False, float(census.quantized), None,
                          f"the recipe's steps make {intended}, but the graph is {actual}: {census.describe()}",
                          kind="precision"))
    if tuning is not None and tuning.get("floor_reached") and not tuning["met"]:
        best = tuning["trials"][tuning["best"]]
        plain = tuning["trials"][0]["quantized"]
        gates.append(Gate(
            "fallback", False, float(best["quantized"]), float(tuning["floor"]),
            f"budget not reachable in INT8: no trial keeping at least {tuning['floor']} quantized nodes "
            f"(fallback.min_quantized {tuning['min_quantized']:g} of the plain model's {plain}) held the budget; "
            f"the best drops {best['drop']:.4f} (allowed {tuning['allowed_drop']:.4f}) with {best['quantized']} "
            "quantized; lower fallback.min_quantized to trade INT8 for accuracy, or keep the FP32 baseline",
            kind="fallback"))
    return gates
