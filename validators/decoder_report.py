"""report.json of a decoder recipe (`kind: decoder`), the CI contract as for every recipe: pydantic models,
their JSON Schema generated into validators/decoder_report.schema.json:

    python -m temper.validators.decoder_report > validators/decoder_report.schema.json

A decoder's report is its own document (`kind: "decoder"`), not report.json's CNN/encoder one: its gates are on
tokens (perplexity, agreement, generation, time to first token) and it has no outputs, batch sizes or engines.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import GenerateJsonSchema

from temper.artifacts.core.host import HostProfile

SCHEMA_VERSION = 1
Interval = tuple[float, float]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DecoderGate(_Model):
    name: str = Field(description='"build", "precision", "nll_delta", "agreement", "kl", "generation"')
    kind: Literal["build", "precision", "quality", "generation", "export"]
    passed: bool
    measured: float | None
    budget: float | None
    interval: Interval | None = Field(description="nll_delta: the paired interval of the per-sequence delta")
    detail: str


class Quality(_Model):
    perplexity: float = Field(description="exp of the mean per-sequence NLL on the recipe's text")
    nll_delta: float = Field(description="mean over sequences of (candidate NLL - baseline NLL), nats per token")
    nll_delta_interval: Interval | None
    agreement: float = Field(description="share of next tokens whose argmax is the baseline's")
    kl: float = Field(description="mean KL(baseline || candidate) per token, nats")
    sequences: int
    tokens: int


class Generation(_Model):
    stopped: list[Literal["eos", "length", "loop"]] = Field(description="per prompt: why greedy decoding stopped")
    tokens: list[int] = Field(description="per prompt: tokens generated")


class Speed(_Model):
    ttft_ms: float = Field(description="median time to first token at the prompt length")
    decode_tokens_per_s: float = Field(description="median decode tokens/s (times the batch size)")
    ttft_speedup: float | None = Field(description="baseline time / this time, geometric mean of paired rounds")
    ttft_speedup_interval: Interval | None
    decode_speedup: float | None
    decode_speedup_interval: Interval | None
    rounds: int


class DecoderModel(_Model):
    """The baseline or one candidate."""

    weights: dict[str, Any] = Field(description="the recipe's weight options (the baseline: {})")
    census: dict[str, int] = Field(description="weight matrices by storage: 4-bit, 8-bit, float")
    size_mb: float = Field(description="the model file and its external data")
    quality: Quality | None = Field(description="against the baseline (null for the baseline itself)")
    generation: Generation
    speed: Speed | None = Field(description="null when the model failed a quality gate (not timed)")
    gates: list[DecoderGate]
    passed: bool = Field(description="every gate held")
    meets_workload: bool = Field(description="its medians meet select's ttft_ms_max and decode_tokens_per_s_min")


class ExportCheck(_Model):
    """The FP32 ONNX baseline against its source framework (transformers) on the same text."""

    source: str = Field(description='"transformers" (the recipe\'s hf folder or gguf file as transformers reads it)')
    source_perplexity: float
    nll_delta: float = Field(description="mean over sequences of (ONNX baseline NLL - source NLL), nats per token")
    nll_delta_interval: Interval | None
    agreement: float = Field(description="share of next tokens whose argmax is the source's")
    gates: list[DecoderGate]
    passed: bool


class SpeedSetup(_Model):
    prompt_length: int
    decode_tokens: int
    batch_size: int
    rounds: int
    confidence: float
    decode_path: str


class DecoderReport(_Model):
    """report.json of `temper run` on a decoder recipe."""

    schema_version: Literal[1]
    kind: Literal["decoder"]
    recipe: str
    host: HostProfile
    baseline: DecoderModel
    baseline_perplexity: float = Field(description="the FP32 baseline's perplexity on the recipe's text")
    export: ExportCheck | None = Field(description="the baseline against its source framework (null for an onnx "
                                       "source, or with validate.export: null)")
    speed_setup: SpeedSetup
    workload: Literal["decode", "prefill"]
    ttft_ms_max: float | None
    decode_tokens_per_s_min: float | None
    candidates: dict[str, DecoderModel]
    not_built: dict[str, str] = Field(default_factory=dict, description="candidate -> why its build failed")
    searches: dict[str, list[str]] = Field(default_factory=dict)
    selected: str = Field(description="a candidate, or baseline")
    selection_reason: str
    passed: bool = Field(description="a candidate was selected")


class _NoFieldTitles(GenerateJsonSchema):
    def field_title_should_be_set(self, schema: Any) -> bool:
        return False


def schema_text() -> str:
    """validators/decoder_report.schema.json's text."""
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema",
              **DecoderReport.model_json_schema(schema_generator=_NoFieldTitles)}
    return json.dumps(schema, indent=2) + "\n"


if __name__ == "__main__":
    print(schema_text(), end="")
