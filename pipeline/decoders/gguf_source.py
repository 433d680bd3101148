"""A GGUF file as a transformers folder, FP32: what the model builder reads when the GGUF's weights are quantized
(its own GGUF reader takes FP16/FP32 files only). transformers dequantizes with the `gguf` package (needs
accelerate); the result is the GGUF's weights exactly, in FP32, so a Q4 GGUF gives a 4-bit-derived baseline.

Run as `python -m temper.pipeline.decoders.gguf_source FILE.gguf OUT_FOLDER` (a process of its own: torch and
the FP32 weights leave with it)."""

from __future__ import annotations

import sys
from pathlib import Path


def to_hf(gguf: Path, out: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype="float32")
    model.hf_quantizer = None  # type: ignore[assignment]  # dequantized already: saved as plain FP32 weights
    model.config.__dict__.pop("quantization_config", None)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


if __name__ == "__main__":
    to_hf(Path(sys.argv[1]), Path(sys.argv[2]))
