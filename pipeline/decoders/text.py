"""The recipe's text as token sequences: the tokenizer the model builder copied beside the model (tokenizers'
tokenizer.json, no transformers needed), the text cut into equal windows for the teacher-forced gates, and the
first rows as generation prompts."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from temper.artifacts.core.errors import RecipeError
from temper.pipeline.decoders.loading import LoadedDecoder


@dataclass(frozen=True)
class TextSet:
    sequences: list[list[int]]  # each data.sequence_length tokens
    prompts: list[list[int]]  # each at most data.prompt_tokens tokens
    calibration: list[list[int]]  # windows after the gated ones (NNCF's AWQ / scale estimation), or none


def _rows(loaded: LoadedDecoder) -> list[str]:
    data, path = loaded.recipe.data, loaded.path(loaded.recipe.data.file)
    try:
        if data.column is None:
            return [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            if data.column not in (reader.fieldnames or []):
                columns = ", ".join(reader.fieldnames or [])
                raise RecipeError(str(loaded.file), "data.column",
                                  f"{path.name} has no column '{data.column}' (columns: {columns})")
            return [row[data.column] for row in reader if row[data.column].strip()]
    except UnicodeDecodeError:
        raise RecipeError(str(loaded.file), "data.file", f"{path} is not UTF-8 text") from None


def text_set(loaded: LoadedDecoder, model_folder: Path, *, calibration: bool = False) -> TextSet:
    """Token windows and prompts, and with `calibration` the data.calibration_sequences windows after them, so a
    data-aware quantizer never calibrates on the text it is gated on; too little text is bad input."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_folder / "tokenizer.json"))
    data = loaded.recipe.data
    rows = _rows(loaded)
    held = data.calibration_sequences if calibration else 0
    stream: list[int] = []
    for row in rows:
        stream.extend(tokenizer.encode(row + "\n", add_special_tokens=False).ids)
        if len(stream) >= (data.sequences + held) * data.sequence_length:
            break
    n = data.sequence_length
    windows = [stream[i * n:(i + 1) * n] for i in range(len(stream) // n)]
    sequences, calibrating = windows[:data.sequences], windows[data.sequences:data.sequences + held]
    if len(sequences) < data.sequences:
        raise RecipeError(str(loaded.file), "data.sequences", f"{data.file} holds {len(stream)} tokens: "
                          f"{len(sequences)} sequences of {n}, not {data.sequences}")
    if len(calibrating) < held:
        raise RecipeError(str(loaded.file), "data.calibration_sequences", f"{data.file} holds {len(stream)} tokens: "
                          f"{len(calibrating)} windows of {n} after the {data.sequences} gated ones, not {held}")
    prompts = [tokenizer.encode(row, add_special_tokens=False).ids[:data.prompt_tokens] for row in rows[:data.prompts]]
    return TextSet(sequences, [p for p in prompts if p], calibrating)
