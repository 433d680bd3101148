"""(model, engine) pairs: what selection chooses among when a recipe lists more than one engine.

The same ONNX file runs at different speeds, and in different precisions, on different engines
(OpenVINO computes an FP32 graph in BF16 on a host with native BF16), so the deployable thing is a
model on an engine. Every built model, the baseline included, is paired with every engine in
`validate.throughput.providers`; each pair is gated on its own outputs and speed against one
reference, the baseline on the first engine listed. A pair on the reference engine keeps the
model's plain name, so a recipe listing one engine reads as it always did; a pair on another engine
is `model@engine` (int8-static@openvino, baseline@openvino-bf16).
"""

from __future__ import annotations

from dataclasses import dataclass

BASELINE = "baseline"
SEPARATOR = "@"


@dataclass(frozen=True)
class Pair:
    model: str  # the baseline or a candidate: its folder in the run's output
    engine: str  # a row of artifacts.engines.providers

    def key(self, reference: str) -> str:
        """The pair's name in report.json: the model's own on the reference engine, else model@engine."""
        return self.model if self.engine == reference else f"{self.model}{SEPARATOR}{self.engine}"


def pairs(models: list[str], engines: list[str]) -> list[Pair]:
    """Every model on every engine, engines in the recipe's order, the baseline first on each."""
    ordered = [BASELINE, *(m for m in models if m != BASELINE)]
    return [Pair(model, engine) for engine in engines for model in ordered]


def reference(engines: list[str]) -> Pair:
    """What every pair's speedup, fidelity and accuracy drop are measured against."""
    return Pair(BASELINE, engines[0])


def split(key: str, reference_engine: str) -> Pair:
    """The pair a report.json candidate key names (Pair.key's inverse)."""
    model, _, engine = key.partition(SEPARATOR)
    return Pair(model, engine or reference_engine)
