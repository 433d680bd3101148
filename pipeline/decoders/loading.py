"""A decoder recipe file into a validated `DecoderRecipe`: YAML, option lists expanded into candidates, the
schema, then every file it names; each problem is one line naming the file and the key (exit 2)."""

from __future__ import annotations

import csv
import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from temper.artifacts.core.errors import RecipeError
from temper.pipeline.decoders.spec import DecoderRecipe
from temper.pipeline.loading import _UniqueKeyLoader as UniqueKeyLoader

SEARCHABLE = {"bits": "{}bit", "algorithm": "{}", "block_size": "b{}", "accuracy_level": "acc{}", "symmetric": "sym{}",
              "mode": "{}", "group_size": "g{}", "ratio": "r{}", "all_layers": "all{}", "awq": "awq{}",
              "scale_estimation": "se{}"}


@dataclass
class LoadedDecoder:
    recipe: DecoderRecipe
    file: Path
    searches: dict[str, list[str]] = field(default_factory=dict)  # searched name -> its candidates

    def path(self, relative: str) -> Path:
        return (self.file.parent / relative).resolve()


def is_decoder(path: Path) -> bool:
    """Whether `path` is a YAML mapping with `kind: decoder` (anything else is left to the CNN loader)."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        return False
    return isinstance(data, dict) and data.get("kind") == "decoder"


def expand(candidates: Any) -> tuple[Any, dict[str, list[str]]]:
    """Each candidate whose `weights` holds lists of a searchable key becomes one candidate per combination."""
    if not isinstance(candidates, dict):
        return candidates, {}
    result: dict[Any, Any] = {}
    searches: dict[str, list[str]] = {}
    for name, spec in candidates.items():
        weights = spec.get("weights") if isinstance(spec, dict) else None
        if not isinstance(weights, dict):
            result[name] = spec
            continue
        listed = {k: v for k, v in weights.items() if k in SEARCHABLE and isinstance(v, list) and v}
        if not listed:
            result[name] = spec
            continue
        searches[name] = []
        for combo in itertools.product(*listed.values()):
            suffix = "-".join(SEARCHABLE[k].format(str(v).lower()) for k, v in zip(listed, combo))
            trial = f"{name}-{suffix}"
            result[trial] = {**spec, "weights": {**weights, **dict(zip(listed, combo))}}
            searches[name].append(trial)
    return result, searches


def _key(loc: tuple[Any, ...]) -> str:
    return ".".join(str(part) for part in loc if not str(part).startswith(("function-", "literal[")))


def load_decoder(path: Path) -> LoadedDecoder:
    file = str(path)
    try:
        data = yaml.load(path.read_bytes(), Loader=UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except FileNotFoundError:
        raise RecipeError(file, "", "file not found") from None
    except OSError as exc:
        raise RecipeError(file, "", f"cannot read: {exc.strerror}") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "YAML"
        raise RecipeError(file, where, f"YAML syntax error: {exc.problem}") from None
    if not isinstance(data, dict):
        raise RecipeError(file, "", "a decoder recipe is a YAML mapping with keys version, kind, name, model, ...")
    data = dict(data)
    data["candidates"], searches = expand(data.get("candidates"))
    try:
        recipe = DecoderRecipe.model_validate(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        message = str(error["msg"]).removeprefix("Value error, ")
        raise RecipeError(file, _key(error["loc"]), message) from None
    loaded = LoadedDecoder(recipe, path.resolve(), searches)
    _files_exist(loaded)
    return loaded


def _files_exist(loaded: LoadedDecoder) -> None:
    file, model = str(loaded.file), loaded.recipe.model
    for key in ("hf", "gguf", "onnx"):
        given = getattr(model, key)
        if given is None:
            continue
        where = loaded.path(given)
        if key == "gguf" and not where.is_file():
            raise RecipeError(file, "model.gguf", f"no file {where}")
        if key != "gguf" and not where.is_dir():
            raise RecipeError(file, f"model.{key}", f"no folder {where}")
        if key == "hf" and not (where / "config.json").is_file():
            raise RecipeError(file, "model.hf", f"{where} has no config.json: not a transformers model folder")
        if key == "onnx" and not (where / "genai_config.json").is_file():
            raise RecipeError(file, "model.onnx", f"{where} has no genai_config.json: not a model builder folder")
    data = loaded.recipe.data
    text = loaded.path(data.file)
    if not text.is_file():
        raise RecipeError(file, "data.file", f"no file {text}")
    if data.column is not None:
        try:
            with text.open(newline="", encoding="utf-8") as handle:
                header = next(csv.reader(handle), [])
        except (OSError, UnicodeDecodeError) as exc:
            raise RecipeError(file, "data.file", f"cannot read {text} as UTF-8 CSV: {exc}") from None
        if data.column not in header:
            raise RecipeError(file, "data.column", f"{text.name} has no column '{data.column}' "
                              f"(columns: {', '.join(header) or 'none'})")
