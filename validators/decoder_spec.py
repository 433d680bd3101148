"""The gates and the selection of a decoder recipe (`validate:` and `select:` of `kind: decoder`): owned here,
beside the gates that read them, as validators/spec.py owns the CNN recipe's."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveInt

from temper.artifacts.core.strict import Strict


class QualitySpec(Strict):
    """The quality gates, each against the baseline on the recipe's text."""

    nll_delta_max: float = Field(0.05, ge=0, description="the candidate's NLL minus the baseline's, nats per "
                                 "token: the upper end of its paired interval over sequences must be at most this")
    agreement_min: float = Field(0.9, ge=0, le=1, description="share of next tokens whose argmax is the baseline's")
    kl_max: float = Field(0.05, ge=0, description="mean KL(baseline || candidate) per token, nats")
    confidence: float = Field(0.95, gt=0, lt=1)
    generation_tokens: PositiveInt = Field(32, description="greedy tokens per prompt at most")
    loop_window: PositiveInt = Field(8, description="a loop: a span of at most this many tokens ...")
    loop_repeats: int = Field(4, ge=2, description="... repeated this many times at the end")


class SpeedSpec(Strict):
    """Time to first token at `prompt_length` and decode tokens/s over `decode_tokens` steps, at `batch_size`
    sequences per call, in `rounds` interleaved rounds paired with the baseline."""

    prompt_length: int = Field(128, ge=1)
    decode_tokens: int = Field(32, ge=1)
    batch_size: PositiveInt = 1
    rounds: int = Field(5, ge=2, le=100)
    confidence: float = Field(0.95, gt=0, lt=1)
    threads: PositiveInt | None = Field(None, description="intra-op threads (default: ONNX Runtime's)")


class ExportSpec(Strict):
    """The FP32 ONNX baseline against its source framework (transformers) on the recipe's text."""

    nll_delta_max: float = Field(0.01, ge=0, description="nats per token: the paired interval of the baseline's NLL "
                                 "minus the source's must lie within plus or minus this")
    agreement_min: float = Field(0.98, ge=0, le=1, description="share of next tokens whose argmax is the source's")


class DecoderValidate(Strict):
    quality: QualitySpec = QualitySpec()
    speed: SpeedSpec = SpeedSpec()
    export: ExportSpec | None = Field(ExportSpec(), description="null: skip the check against the source")


class WorkloadSelect(Strict):
    """What the selected candidate is for. `workload: decode` (long answers, chat) ranks by decode tokens/s,
    `prefill` (long prompts, short answers: classification, RAG) by time to first token. The limits are
    constraints every candidate must meet (the medians over rounds) before ranking."""

    workload: Literal["decode", "prefill"] = "decode"
    ttft_ms_max: float | None = Field(None, gt=0)
    decode_tokens_per_s_min: float | None = Field(None, gt=0)
