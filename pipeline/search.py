"""Configuration search: a candidate whose step options list alternatives becomes one candidate per
combination, so each is built (cached), validated and reported like any other, and selection keeps
the fastest that passes every gate.

    int8:
      max_trials: 6
      steps:
        - quantize: {mode: static, format: [qdq, qoperator], per_channel: [true, false]}

becomes `int8.format-qdq.per_channel-true`, `int8.format-qdq.per_channel-false`, ... Expansion runs on
the raw YAML, before the schema, so every error names the key the user wrote.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from temper.artifacts.core.errors import RecipeError
from temper.pipeline.recipe import StepSpec
from temper.pipeline.steps import STEPS, searchable

# Scalar options whose list value means "try each" (each step's `searchable`); list-valued options
# (exclude_nodes) are not searched. OPTION_MODELS: their options models (quantize: one per backend), for
# `temper schema`.
SEARCHABLE = searchable()
OPTION_MODELS = {name: STEPS[name].option_models() for name in SEARCHABLE}
DEFAULT_MAX_TRIALS = 16


class RefusedAlternative(Exception):
    """One listed alternative the schema refuses: `at` is its place in the recipe, `error` pydantic's
    error on the step `data` holding it. The loader words it (pipeline.loading.describe)."""

    def __init__(self, at: str, error: Any, data: dict[str, Any]) -> None:
        super().__init__(at)
        self.at, self.error, self.data = at, error, data


@dataclass(frozen=True)
class Search:
    """One searched candidate: the names of the combinations built, and how many there were in all."""

    name: str
    trials: list[str]
    combinations: int


def expand(data: dict[str, Any], file: str) -> tuple[dict[str, Any], dict[str, Search]]:
    """The recipe data with every searched candidate replaced by its combinations (in order, the
    first value of each list first), and what was searched. Raises RecipeError for a malformed
    search, RefusedAlternative for a listed value the schema refuses."""
    candidates = data.get("candidates")
    if not isinstance(candidates, dict):
        return data, {}
    expanded: dict[str, Any] = {}
    searches: dict[str, Search] = {}
    for name, spec in candidates.items():
        where = f"candidates.{name}"
        axes = _axes(spec, where, file) if isinstance(spec, dict) else []
        if not axes:
            if isinstance(spec, dict) and "max_trials" in spec:
                raise RecipeError(file, f"{where}.max_trials",
                                  "bounds a search, but no step option of this candidate lists alternatives")
            expanded[name] = spec
            continue
        limit = _max_trials(spec, where, file)
        combinations = list(itertools.product(*(axis.values for axis in axes)))
        trials = []
        for values in combinations[:limit]:
            trial = f"{name}." + ".".join(f"{axis.key}-{_label(value)}"
                                          for axis, value in zip(axes, values, strict=True))
            expanded[trial] = _with(spec, axes, values)
            trials.append(trial)
        searches[name] = Search(name, trials, len(combinations))
    _refuse_collisions(candidates, searches, file)
    return {**data, "candidates": expanded}, searches


def _refuse_collisions(candidates: dict[str, Any], searches: dict[str, Search], file: str) -> None:
    """A combination named like another candidate (explicit or another search's) would silently
    replace it in the run: refuse it at the later one's key, naming both."""
    owner: dict[str, str] = {}  # candidate name -> where it comes from, in file order
    for name in candidates:
        produced = searches[name].trials if name in searches else [name]
        for each in produced:
            earlier = owner.get(each)
            if earlier is not None:
                raise RecipeError(file, f"candidates.{name}",
                                  f"'{each}' is both {_source(earlier, searches)} and {_source(name, searches)}: "
                                  "two candidates cannot share a name; rename one of them, or drop the alternative "
                                  "the explicit candidate already covers")
            owner[each] = name


def _source(name: str, searches: dict[str, Search]) -> str:
    return f"a combination of the search candidates.{name}" if name in searches else f"the candidate candidates.{name}"


@dataclass(frozen=True)
class _Axis:
    step: int
    kind: str
    key: str
    values: list[Any]


def _axes(spec: dict[str, Any], where: str, file: str) -> list[_Axis]:
    steps = spec.get("steps")
    axes: list[_Axis] = []
    for index, step in enumerate(steps if isinstance(steps, list) else []):
        if not (isinstance(step, dict) and len(step) == 1):
            continue
        kind, options = next(iter(step.items()))
        if not isinstance(options, dict):
            continue
        for key in SEARCHABLE.get(kind, ()):
            values = options.get(key)
            if not isinstance(values, list):
                continue
            at = f"{where}.steps[{index}].{kind}.{key}"
            if not values:
                raise RecipeError(file, at,
                                  "an empty list of alternatives: give at least one value (or a single value)")
            seen: dict[str, int] = {}
            for position, value in enumerate(values):
                _check_value(kind, options, key, value, f"{at}[{position}]")
                label = _label(value)
                if label in seen:
                    raise RecipeError(file, f"{at}[{position}]",
                                      f"{value!r} is listed twice (also at {at}[{seen[label]}]): each alternative "
                                      "is built once, so remove the repeat")
                seen[label] = position
            axes.append(_Axis(index, kind, key, values))
    return axes


def _check_value(kind: str, options: dict[str, Any], key: str, value: Any, at: str) -> None:
    """Refuse an alternative the schema would refuse, naming it by its place in the list."""
    probe = {k: (v[0] if k in SEARCHABLE[kind] and isinstance(v, list) and v else v) for k, v in options.items()}
    probe[key] = value
    try:
        StepSpec.model_validate({kind: probe})
    except ValidationError as exc:
        for error in exc.errors():
            if error["loc"][-1:] == (key,):
                raise RefusedAlternative(at, error, {kind: probe}) from None


def _max_trials(spec: dict[str, Any], where: str, file: str) -> int:
    limit = spec.get("max_trials", DEFAULT_MAX_TRIALS)
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise RecipeError(file, f"{where}.max_trials",
                          f"{limit!r} is not a number of trials: use a whole number of at least 1")
    return limit


def _with(spec: dict[str, Any], axes: list[_Axis], values: tuple[Any, ...]) -> dict[str, Any]:
    steps = [dict(step) if isinstance(step, dict) else step for step in spec["steps"]]
    for axis, value in zip(axes, values, strict=True):
        steps[axis.step] = {axis.kind: {**steps[axis.step][axis.kind], axis.key: value}}
    return {k: v for k, v in spec.items() if k != "max_trials"} | {"steps": steps}


def _label(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) or value is None else str(value)

