"""Read a recipe file into a validated `Recipe`, turning every problem into one RecipeError line."""

from __future__ import annotations

import hashlib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from temper.artifacts.core.errors import RecipeError, close_names
from temper.pipeline import presets
from temper.pipeline.quantize_backends import BACKENDS
from temper.pipeline.recipe import Recipe
from temper.pipeline.search import RefusedAlternative, Search, expand
from temper.pipeline.steps import STEPS


@dataclass(frozen=True)
class LoadedRecipe:
    recipe: Recipe
    file: str  # as the user wrote it, for messages
    base: Path  # the recipe's folder: relative paths inside it resolve here
    sha256: str
    searches: dict[str, Search] = field(default_factory=dict)  # searched candidate -> its trials
    preset_choice: presets.Choice | None = None  # what `preset: auto` resolved to, and why

    def path(self, relative: str) -> Path:
        return (self.base / relative).resolve()


def load_recipe(path: Path) -> LoadedRecipe:
    file = str(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise RecipeError(file, "", "file not found") from None
    except OSError as exc:
        raise RecipeError(file, "", f"cannot read: {exc.strerror}") from None
    try:
        data = yaml.load(raw, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "YAML"
        raise RecipeError(file, where, f"YAML syntax error: {exc.problem}") from None
    if not isinstance(data, dict):
        raise RecipeError(file, "", "a recipe is a YAML mapping with keys version, name, model, candidates, ...")
    if data.get("kind") == "decoder":  # pipeline/decoders/: `temper run` dispatches before this loader
        raise RecipeError(file, "kind", "a decoder recipe: only `temper run` takes it so far (docs/decoders.md)")
    try:
        data, searches = expand(data, file)
    except RefusedAlternative as refused:
        raise RecipeError(file, refused.at, describe(refused.error, refused.data)[1]) from None
    target = data.get("target", presets.HOST)  # an unknown target is refused below, with its key
    choice = presets.choose(target if target in presets.TARGETS else presets.HOST)
    try:
        recipe = Recipe.model_validate(data, context={"preset_choice": choice})
    except ValidationError as exc:
        key, message = _in_user_terms(*describe(exc.errors()[0], data), searches)
        raise RecipeError(file, key, message) from None
    _fallbacks_have_a_budget(recipe, file, searches)
    return LoadedRecipe(recipe, file, path.resolve().parent, hashlib.sha256(raw).hexdigest(), searches, choice)


class _UniqueKeyLoader(yaml.SafeLoader):
    """Safe YAML that refuses a key given twice in one mapping: YAML says keys are unique, and
    PyYAML's last-one-wins would silently drop the first setting."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, typing.Hashable):
                continue  # SafeLoader refuses an unhashable key itself, with its own mark
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}: each key may appear once in a mapping", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _in_user_terms(key: str, message: str, searches: dict[str, Search]) -> tuple[str, str]:
    """An error in one combination of a search, at the key the user wrote, naming the combination."""
    for search in searches.values():
        for trial in search.trials:
            prefix = f"candidates.{trial}"
            if key == prefix or key.startswith(prefix + "."):
                combination = trial.removeprefix(search.name + ".")
                return (f"candidates.{search.name}{key.removeprefix(prefix)}",
                        f"{message} (in the combination {combination})")
    return key, message


def _fallbacks_have_a_budget(recipe: Recipe, file: str, searches: dict[str, Search]) -> None:
    """A step aiming at the accuracy budget (quantize's fallback) needs one, named at its option."""
    if recipe.validation is not None and recipe.validation.accuracy is not None:
        return
    for name, candidate in recipe.candidates.items():
        for index, spec in enumerate(candidate.steps):
            step = STEPS[spec.name]
            if step.uses_evaluation(spec.options):
                raise RecipeError(file, *_in_user_terms(
                    f"candidates.{name}.steps[{index}].{spec.name}.{step.budget_option}",
                    "aims at the accuracy budget, but the recipe has no validate.accuracy: "
                    "add one, e.g. validate: {accuracy: {metric: top1, max_drop: 0.01}}", searches))


def describe(error: Any, data: Any) -> tuple[str, str]:
    """Key path and message for one pydantic error, in the recipe's own terms."""
    loc = _data_loc(error["loc"], data)
    kind, given = error["type"], error.get("input")
    if (worded := backend_terms(error, loc)) is not None:
        return worded
    if kind == "extra_forbidden":
        valid = _fields_at(loc[:-1])
        close = close_names(str(loc[-1]), valid, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else (f" (valid keys: {', '.join(valid)})" if valid else "")
        return _path(loc), f"unknown key '{loc[-1]}'{hint}"
    if kind == "missing":
        return _path(loc), "missing required key"
    if kind == "literal_error":
        expected = error["ctx"]["expected"].replace("'", "").replace(" or ", ", ")
        return _path(loc), f"{given!r} is not one of {expected}"
    message = error["msg"].removeprefix("Value error, ")
    if kind != "value_error" and not isinstance(given, (dict, list)):
        message += f" (got {given!r})"
    return _path(loc), message


def backend_terms(error: Any, loc: tuple[Any, ...]) -> tuple[str, str] | None:
    """A quantize step's error that the backends' union would word in pydantic's terms (an unknown backend, a key
    or a value of another backend), in the recipe's: what takes it, and the `backend:` it needs. None: not one."""
    raw, kind = tuple(error["loc"]), error["type"]
    if kind == "union_tag_invalid" and raw and raw[-1] == "quantize":
        tag = error.get("ctx", {}).get("tag", "")
        return _path((*loc, "backend")), f"{tag!r} is not one of {', '.join(BACKENDS)}"
    at = [i + 1 for i in range(len(raw) - 1) if raw[i] == "quantize" and raw[i + 1] in BACKENDS]
    if not at:
        return None
    if at[0] == len(raw) - 1:  # the backend's own model-level check (mode: dynamic): at the step's key
        return _path(loc[:-1] if loc and loc[-1] == raw[-1] else loc), error["msg"].removeprefix("Value error, ")
    if at[0] != len(raw) - 2 or kind not in ("extra_forbidden", "literal_error") or not loc:
        return None  # deeper (fallback's own keys), or another kind: worded as any error
    chosen, key, given = BACKENDS[str(raw[at[0]])], str(loc[-1]), error.get("input")
    if kind == "extra_forbidden":
        if key in chosen.options.instead:
            return _path(loc), chosen.options.instead[key]
        others = [b for b in BACKENDS.values() if key in b.options.model_fields]
        if not others:
            valid = list(chosen.options.model_fields)
            close = close_names(key, valid, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else f" (valid keys: {', '.join(valid)})"
            return _path(loc), f"unknown key '{key}'{hint}"
        named = " or ".join(f"{b.label}" for b in others)
        return _path(loc), f"an option of {named}: it needs backend: {' or '.join(b.name for b in others)}"
    if not isinstance(given, str | int | float | bool):  # a mapping or list where a name goes: worded as any error
        return None
    takers = [b for b in BACKENDS.values() if b is not chosen and key in b.options.model_fields
              and given in _literals(b.options.model_fields[key].annotation)]
    if not takers:
        return None
    return _path(loc), f"{given} is {takers[0].label}'s {key}: it needs backend: {takers[0].name}"


def _literals(annotation: Any) -> set[Any]:
    """The values a (possibly optional, nested) Literal annotation allows."""
    if typing.get_origin(annotation) is typing.Literal:
        return set(typing.get_args(annotation))
    return {value for arg in typing.get_args(annotation) for value in _literals(arg)}


def _data_loc(loc: tuple[Any, ...], data: Any) -> tuple[Any, ...]:
    """Drop pydantic's internal loc parts (union member names, validator tags) that are not in the data."""
    kept: list[Any] = []
    for i, part in enumerate(loc):
        if isinstance(data, dict) and part in data:
            data = data[part]
        elif isinstance(data, list) and isinstance(part, int) and part < len(data):
            data = data[part]
        elif not (i == len(loc) - 1 and isinstance(part, str) and part != "[key]"
                  and (isinstance(data, dict) or part == data)):
            continue  # a union member or tag name, not a key the user wrote
        kept.append(part)
    return tuple(kept)


def _path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _fields_at(loc: tuple[Any, ...]) -> list[str]:
    """Valid keys of the pydantic model reached by following `loc` from Recipe."""
    node: Any = Recipe
    for part in loc:
        model = _model_in(node)
        if model is not None:
            fields = {f.alias or name: f for name, f in model.model_fields.items()}
            if part in fields:
                node = fields[part].annotation
        else:
            node = _element(node)
    model = _model_in(node)
    return [f.alias or name for name, f in model.model_fields.items()] if model else []


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) is typing.Annotated:  # a tagged union (the quantize backends): its first
        return _model_in(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            if (found := _model_in(arg)) is not None:
                return found
    return None


def _element(annotation: Any) -> Any:
    """The value type of a list or dict annotation (for walking into steps[2] or candidates.x)."""
    args = typing.get_args(annotation)
    return args[-1] if args else annotation
