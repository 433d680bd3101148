"""The FP32 baseline of a decoder recipe and its weight candidates, each a folder the decoder session reads
(model.onnx, its external data, genai_config.json, the tokenizer).

The baseline comes from ONNX Runtime GenAI's model builder (a process of its own, FP32 for the CPU): it knows
each architecture's attention, rotary embeddings and KV cache layout, which hand-written export code would have
to track model by model, and it writes weights as external data (no 2 GB protobuf limit). Its output is cached by
the bytes of the source and the builder's version.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from importlib.metadata import version
from pathlib import Path

from temper.artifacts.core.errors import EnvironmentProblem, RecipeError
from temper.pipeline.decoders.loading import LoadedDecoder
from temper.pipeline.decoders.spec import WeightOptions

SIDE_FILES = ("genai_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
              "chat_template.jinja", "generation_config.json")


def _digest(path: Path) -> str:
    sha = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for file in files:
        sha.update(file.name.encode())
        with file.open("rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                sha.update(chunk)
    return sha.hexdigest()


def _run(command: list[str], what: str, file: str, key: str) -> None:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        lines = [line for line in (done.stderr or done.stdout).splitlines() if line.strip()]
        raise RecipeError(file, key, f"{what} failed: {lines[-1] if lines else f'exit {done.returncode}'}")


def run_module(arguments: list[str], what: str, file: str, key: str) -> None:
    """`python -m ARGUMENTS` in a process of its own (torch and the weights leave with it); a failure is one line."""
    _run([sys.executable, "-m", *arguments], what, file, key)


def baseline(loaded: LoadedDecoder, cache_root: Path, *, use_cache: bool = True) -> Path:
    """The FP32 decoder folder: the recipe's own ONNX folder, else the builder's output (cached)."""
    source = loaded.recipe.model
    if source.onnx is not None:
        return loaded.path(source.onnx)
    try:
        builder = version("onnxruntime-genai")
    except Exception:
        raise EnvironmentProblem("onnxruntime-genai is not installed: pip install 'temper-ml[llm]'") from None
    given = loaded.path(source.hf or source.gguf or "")
    key = hashlib.sha256(f"{_digest(given)}|{builder}|fp32|cpu".encode()).hexdigest()[:24]
    folder = cache_root / "decoders" / key
    if use_cache and (folder / "genai_config.json").is_file():
        return folder
    file = str(loaded.file)
    with tempfile.TemporaryDirectory(prefix="temper-decoder-") as work:
        hf = given
        if source.gguf is not None:
            hf = Path(work) / "hf"
            _run([sys.executable, "-m", "temper.pipeline.decoders.gguf_source", str(given), str(hf)],
                 "reading the GGUF file", file, "model.gguf")
        built = Path(work) / "onnx"
        _run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf), "-o", str(built),
              "-p", "fp32", "-e", "cpu", "-c", str(Path(work) / "cache")],
             "ONNX Runtime GenAI's model builder", file, "model.hf" if source.hf else "model.gguf")
        folder.parent.mkdir(parents=True, exist_ok=True)
        staged = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=folder.parent))
        for item in built.iterdir():
            shutil.move(str(item), staged / item.name)
        shutil.rmtree(folder, ignore_errors=True)
        staged.rename(folder)
    return folder


def _side_files(src: Path, dst: Path) -> None:
    for name in SIDE_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, dst / name)


def kept_float(base: Path, options: WeightOptions) -> list[str]:
    """The weight MatMuls `keep_float` names (by a part of their node name): left out of quantization."""
    import onnx

    from temper.artifacts.engines.decoder_session import DecoderLayout

    if not options.keep_float:
        return []
    graph = onnx.load(str(base / DecoderLayout.read(base).filename), load_external_data=False).graph
    constants = {t.name for t in graph.initializer}
    return [n.name for n in graph.node if n.op_type == "MatMul" and len(n.input) > 1 and n.input[1] in constants
            and any(part in n.name for part in options.keep_float)]


def candidate(base: Path, options: WeightOptions, out: Path,
              calibration: Sequence[Sequence[int]] = ()) -> tuple[Path, list[str]]:
    """`out`: the baseline's weights stored as `options` says, beside the baseline's side files; and the weight
    MatMuls left in float. `calibration`: token windows for a data-aware method (NNCF's AWQ, scale estimation,
    GPTQ)."""
    from temper.artifacts.engines.decoder_session import DecoderLayout

    out.mkdir(parents=True, exist_ok=True)
    name = DecoderLayout.read(base).filename
    kept = kept_float(base, options)
    # ONNX Runtime's quantizers log every node at INFO (a line per MatMul) and advise pre-processing at WARNING
    logging.getLogger("onnxruntime.quantization").setLevel(logging.ERROR)
    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.ERROR)
    if options.method == "int8-dynamic":
        from onnxruntime.quantization import QuantType, quantize_dynamic

        quantize_dynamic(base / name, out / name, weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul"],
                         nodes_to_exclude=kept, use_external_data_format=True,
                         extra_options={"MatMulConstBOnly": True})
    elif options.method == "nncf":
        from temper.pipeline.decoders.nncf_weights import compress

        compress(base, name, options, kept, out, calibration)
    else:
        from temper.pipeline.decoders.nbits_weights import quantize

        quantize(base, name, options, kept, out, calibration)
    _side_files(base, out)
    return out, kept
