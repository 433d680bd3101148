"""The quantize step's proof of work: the graph it wrote must hold quantized compute nodes.

A quantizer that meets nothing it can rewrite (compute inside If/Loop bodies, every node excluded)
writes an FP32 graph without complaint; labelled int8 it would pass every gate and be published as
INT8. The graph census (validators/census.py) is what decides, not the step's name.
"""

from __future__ import annotations

from pathlib import Path

from temper.artifacts.core.errors import StepFailed
from temper.validators.census import ELIGIBLE, Census, of_file


def require_quantized(path: Path, backend: str) -> Census:
    """The census of the model at `path`; StepFailed (one line, what to do) when nothing is quantized."""
    counted = of_file(path)
    if counted.quantized:
        return counted
    raise _nothing(counted, backend)


def require_quantizable(path: Path, backend: str) -> None:
    """Before the quantizer runs on the model at `path`: StepFailed, the line `require_quantized` gives once it
    has run, when the graph has no eligible node or all of them inside If/Loop/Scan bodies, which no quantizer
    rewrites (what `temper check` forecasts as a rejection). On Silero VAD pre-processing failed on the branches
    first, which made the same model a build error (exit 1) in `temper run` and a rejection in `temper check`."""
    counted = of_file(path)
    if not counted.eligible or counted.in_subgraphs == counted.eligible:
        raise _nothing(counted, backend)


def _nothing(counted: Census, backend: str) -> StepFailed:
    """No quantized node, and what to do: a rejection (a verdict on the candidate, no library error behind it)."""
    if not counted.eligible:
        return StepFailed(f"quantize wrote no quantized node: the graph has no {'/'.join(ELIGIBLE)} node to quantize; "
                          "drop this candidate (INT8 cannot speed this model up)")
    where = f"0 of {counted.eligible} eligible"
    if counted.in_subgraphs:
        where += f"; {counted.in_subgraphs} are inside If/Loop/Scan subgraphs, which {backend} leaves alone"
    hint = ("export the model without control flow around its compute (fixed branches, unrolled loops), "
            "or drop this candidate" if counted.in_subgraphs == counted.eligible
            else "exclude fewer nodes (exclude_nodes, exclude_op_types), or drop this candidate")
    return StepFailed(f"quantize wrote no quantized node ({where}): {hint}")


def subgraph_notice(counted: Census, backend: str) -> str | None:
    """What `temper check` says before a quantize step runs on a graph with compute inside subgraphs (Silero
    VAD keeps all of it in If branches): how much of it the quantizer will leave in float; None when none."""
    if not counted.in_subgraphs:
        return None
    line = (f"{counted.in_subgraphs} of {counted.eligible} compute nodes are inside If/Loop/Scan subgraphs, "
            f"which {backend} leaves in float")
    if counted.in_subgraphs == counted.eligible:
        return line + ": this step will quantize nothing and its candidate will be rejected"
    return line + f": only the other {counted.eligible - counted.in_subgraphs} can become INT8"
