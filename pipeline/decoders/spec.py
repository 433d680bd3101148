"""A decoder recipe (`kind: decoder`): a causal LM with its KV cache, its text, weight candidates, quality and
speed gates, and the workload the selection serves. Its own schema beside the CNN/encoder `Recipe`: a decoder
has no `model.inputs` to declare (the builder fixes them) and its gates are perplexity and tokens, not outputs."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveInt, model_validator

from temper.artifacts.strict import Strict
from temper.pipeline.recipe import CandidateName


class DecoderSource(Strict):
    """Exactly one: a transformers causal-LM folder (config.json, safetensors, tokenizer), a GGUF file (its
    weights dequantized to FP32 first), or a folder ONNX Runtime GenAI's model builder already wrote. The first
    two go through that builder (`onnxruntime_genai.models.builder`, FP32, CPU), which writes the graph with its
    KV cache and its weights as external data."""

    hf: str | None = None
    gguf: str | None = None
    onnx: str | None = Field(None, description="a folder with genai_config.json and its model file")

    @model_validator(mode="after")
    def _one(self) -> DecoderSource:
        if sum(v is not None for v in (self.hf, self.gguf, self.onnx)) != 1:
            raise ValueError("give exactly one of 'hf' (a transformers folder), 'gguf' (a .gguf file) or "
                             "'onnx' (a folder the model builder wrote)")
        return self


class TextData(Strict):
    """The recipe's own text: a .txt file (one document, cut into sequences) or a .csv file's column."""

    file: str
    column: str | None = Field(None, description="the .csv column holding the text")
    sequences: PositiveInt = Field(16, description="teacher-forced sequences the quality gates pair over")
    sequence_length: int = Field(64, ge=2, le=8192, description="tokens per sequence")
    prompts: PositiveInt = Field(2, description="prompts of the greedy generation check (the first rows)")
    prompt_tokens: int = Field(16, ge=1, description="tokens of each generation prompt")


class WeightOptions(Strict):
    """How a candidate's weight matrices are stored. `int8-dynamic`: ONNX Runtime's quantize_dynamic on every
    MatMul (INT8 weights, activations quantized per call). `matmul-nbits`: ONNX Runtime's MatMulNBitsQuantizer,
    `bits` per weight in blocks of `block_size`; `algorithm` rtn is its built-in round-to-nearest (the DEFAULT
    config), hqq its half-quadratic quantizer; `accuracy_level` 4 lets the CPU kernel compute in INT8."""

    method: Literal["int8-dynamic", "matmul-nbits"]
    bits: Literal[4, 8] = 4
    algorithm: Literal["rtn", "hqq"] = "rtn"
    block_size: Literal[16, 32, 64, 128, 256] = 128
    symmetric: bool = Field(False, description="rtn only: symmetric blocks (no zero point)")
    accuracy_level: Literal[0, 1, 2, 3, 4] = Field(4, description="MatMulNBits' compute type: 0 unset, "
                                                   "1 fp32, 2 fp16, 3 bf16, 4 int8 (the CPU's fast path)")

    @model_validator(mode="after")
    def _fits(self) -> WeightOptions:
        nbits = {"bits", "algorithm", "block_size", "symmetric", "accuracy_level"} & self.model_fields_set
        if self.method == "int8-dynamic" and nbits:
            raise ValueError(f"'{sorted(nbits)[0]}' applies to method matmul-nbits only")
        if self.algorithm == "hqq" and "symmetric" in self.model_fields_set:
            raise ValueError("'symmetric' applies to algorithm rtn only")
        return self


class DecoderCandidate(Strict):
    weights: WeightOptions


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


class DecoderValidate(Strict):
    quality: QualitySpec = QualitySpec()
    speed: SpeedSpec = SpeedSpec()


class WorkloadSelect(Strict):
    """What the selected candidate is for. `workload: decode` (long answers, chat) ranks by decode tokens/s,
    `prefill` (long prompts, short answers: classification, RAG) by time to first token. The limits are
    constraints every candidate must meet (the medians over rounds) before ranking."""

    workload: Literal["decode", "prefill"] = "decode"
    ttft_ms_max: float | None = Field(None, gt=0)
    decode_tokens_per_s_min: float | None = Field(None, gt=0)


class DecoderRecipe(Strict):
    """A decoder recipe: `version: 1`, `kind: decoder`."""

    version: Literal[1]
    kind: Literal["decoder"]
    name: CandidateName
    model: DecoderSource
    data: TextData
    candidates: dict[CandidateName, DecoderCandidate] = Field(min_length=1)
    validation: DecoderValidate = Field(DecoderValidate(), alias="validate")
    select: WorkloadSelect = WorkloadSelect()

    @model_validator(mode="after")
    def _names(self) -> DecoderRecipe:
        if "baseline" in self.candidates:
            raise ValueError("'baseline' is reserved for the FP32 model; rename the candidate")
        if self.data.file.endswith(".csv") != (self.data.column is not None):
            raise ValueError("data.column names the text column of a .csv file (and only of one)")
        return self
