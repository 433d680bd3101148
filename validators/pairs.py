"""(model, provider) pairs: what selection chooses among when a recipe lists more than one provider.

The same ONNX file runs at different speeds, and in different precisions, on different providers
(OpenVINO computes an FP32 graph in BF16 on a host with native BF16), so the deployable thing is a
model on a provider. Every built model, the baseline included, is paired with every provider in
`validate.throughput.providers`; each pair is gated on its own outputs and speed against one
reference, the baseline on the first provider listed. A pair on the reference provider keeps the
model's plain name, so a recipe listing one provider reads as it always did; a pair on another one
is `model@provider` (int8-static@openvino, baseline@openvino-bf16). report.json keeps its published
key `engine` for a pair's provider.
"""

from __future__ import annotations

from dataclasses import dataclass

from temper.artifacts.engines.providers import Provider, provider_named

BASELINE = "baseline"
SEPARATOR = "@"


@dataclass(frozen=True)
class Pair:
    model: str  # the baseline or a candidate: its folder in the run's output
    provider: Provider  # a row of artifacts/engines/providers.py

    def key(self, reference: str) -> str:
        """The pair's name in report.json: the model's own on the reference provider, else model@provider."""
        return self.model if self.provider == reference else f"{self.model}{SEPARATOR}{self.provider}"


def pairs(models: list[str], providers: list[Provider]) -> list[Pair]:
    """Every model on every provider, providers in the recipe's order, the baseline first on each."""
    ordered = [BASELINE, *(m for m in models if m != BASELINE)]
    return [Pair(model, provider) for provider in providers for model in ordered]


def reference(providers: list[Provider]) -> Pair:
    """What every pair's speedup, fidelity and accuracy drop are measured against."""
    return Pair(BASELINE, providers[0])


def split(key: str, reference_provider: Provider) -> Pair:
    """The pair a report.json candidate key names (Pair.key's inverse)."""
    model, _, provider = key.partition(SEPARATOR)
    return Pair(model, provider_named(provider) if provider else reference_provider)
