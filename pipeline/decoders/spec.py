"""A decoder recipe (`kind: decoder`): a causal LM with its KV cache, its text, weight candidates, quality and
speed gates, and the workload the selection serves. Its own schema beside the CNN/encoder `Recipe`: a decoder
has no `model.inputs` to declare (the builder fixes them) and its gates are perplexity and tokens, not outputs."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveInt, model_validator

from temper.artifacts.core.strict import Strict
from temper.pipeline.recipe import CandidateName, MlflowTarget
from temper.validators.decoder_spec import DecoderValidate, WorkloadSelect


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
    calibration_sequences: PositiveInt = Field(8, description="windows after the gated ones that NNCF's AWQ, "
                                               "scale estimation and GPTQ calibrate on (read only when a candidate "
                                               "asks)")

    @model_validator(mode="after")
    def _column(self) -> TextData:
        if self.file.endswith(".csv") != (self.column is not None):
            raise ValueError("data.column names the text column of a .csv file (and only of one)")
        return self


class WeightOptions(Strict):
    """How a candidate's weight matrices are stored. `int8-dynamic`: ONNX Runtime's quantize_dynamic on every
    MatMul (INT8 weights, activations quantized per call). `matmul-nbits`: ONNX Runtime's MatMulNBitsQuantizer,
    `bits` per weight in blocks of `block_size`; `algorithm` rtn is its built-in round-to-nearest (the DEFAULT
    config), hqq its half-quadratic quantizer, k_quant llama.cpp's per-block scale and minimum search, gptq GPTQ
    calibrated on held-out windows of the recipe's text (4-bit only; k_quant and gptq are the Intel Neural Compressor
    code ONNX Runtime vendors); `accuracy_level` 4 lets the CPU kernel compute in INT8. `nncf`:
    NNCF's compress_weights in `mode`, 4-bit weights in groups of `group_size`, `ratio` of them at 4 bits and the
    rest at its INT8 backup, optionally AWQ and scale estimation on held-out windows of the recipe's text."""

    method: Literal["int8-dynamic", "matmul-nbits", "nncf"]
    bits: Literal[4, 8] = 4
    algorithm: Literal["rtn", "hqq", "k_quant", "gptq"] = "rtn"
    block_size: Literal[16, 32, 64, 128, 256] = 128
    symmetric: bool = Field(False, description="rtn only: symmetric blocks (no zero point)")
    accuracy_level: Literal[0, 1, 2, 3, 4] = Field(4, description="MatMulNBits' compute type: 0 unset, "
                                                   "1 fp32, 2 fp16, 3 bf16, 4 int8 (the CPU's fast path)")

    mode: Literal["int4_sym", "int4_asym", "int8_sym", "int8_asym"] = "int4_sym"
    group_size: Literal[-1, 16, 32, 64, 128, 256] = Field(128, description="nncf int4: weights per scale "
                                                          "(-1: one per output channel)")
    ratio: float = Field(1.0, gt=0, le=1, description="nncf int4: share of the weights at 4 bits, the rest 8-bit")
    all_layers: bool = Field(False, description="nncf int4: the embeddings and last MatMul at 4 bits too "
                                                "(NNCF keeps them 8-bit by default)")
    awq: bool = Field(False, description="nncf int4: activation-aware scaling (calibrates on the text)")
    scale_estimation: bool = Field(False, description="nncf int4: data-aware scales (calibrates on the text)")

    keep_float: list[str] = Field(default_factory=list, description="weight MatMuls whose node name holds one of "
                                  "these stay float (e.g. [lm_head]): the precision gate expects exactly those")

    @model_validator(mode="after")
    def _fits(self) -> WeightOptions:
        given = self.model_fields_set
        nbits = {"bits", "algorithm", "block_size", "symmetric", "accuracy_level"} & given
        nncf = {"mode", "group_size", "ratio", "all_layers", "awq", "scale_estimation"} & given
        if self.method != "matmul-nbits" and nbits:
            raise ValueError(f"'{sorted(nbits)[0]}' applies to method matmul-nbits only")
        if self.method != "nncf" and nncf:
            raise ValueError(f"'{sorted(nncf)[0]}' applies to method nncf only")
        int4_only = {"group_size", "ratio", "all_layers", "awq", "scale_estimation"} & given
        if self.mode.startswith("int8") and int4_only:
            raise ValueError(f"'{sorted(int4_only)[0]}' applies to nncf's int4 modes only (int8 is per channel, "
                             "every weight)")
        if self.algorithm != "rtn" and "symmetric" in given:
            raise ValueError(f"'symmetric' applies to algorithm rtn only ({self.algorithm} stores a zero point per "
                             "block)")
        if self.algorithm == "gptq" and self.bits != 4:
            raise ValueError("algorithm gptq stores 4-bit weights only (ONNX Runtime's GPTQ leaves other widths "
                             "float)")
        return self

    @property
    def calibrates(self) -> bool:
        """Whether building this candidate needs calibration text (NNCF's AWQ or scale estimation, GPTQ)."""
        return self.awq or self.scale_estimation or (self.method == "matmul-nbits" and self.algorithm == "gptq")

    @property
    def expected(self) -> str:
        """The precision every weight matrix but the kept-float ones must be stored in ("4-bit", "8-bit")."""
        if self.method == "matmul-nbits":
            return f"{self.bits}-bit"
        return "8-bit" if self.method == "int8-dynamic" or self.mode.startswith("int8") else "4-bit"

    @property
    def backup(self) -> str | None:
        """The precision NNCF may store some weights in instead (int4 with ratio < 1, or not all_layers)."""
        if self.method == "nncf" and self.mode.startswith("int4") and (self.ratio < 1 or not self.all_layers):
            return "8-bit"
        return None


class DecoderCandidate(Strict):
    weights: WeightOptions


class DecoderPublish(Strict):
    """Where the selection is registered (as for every recipe); a decoder has no batching options to set."""

    mlflow: MlflowTarget


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
    publish: DecoderPublish | None = None

    @model_validator(mode="after")
    def _names(self) -> DecoderRecipe:
        if "baseline" in self.candidates:
            raise ValueError("'baseline' is reserved for the FP32 model; rename the candidate")
        return self
