"""The recipe JSON Schema `temper schema` prints: pydantic's, plus what the loader accepts before
pydantic sees a recipe (bare step names, lists of alternatives, a candidate's max_trials)."""

from __future__ import annotations

from typing import Any

from temper.pipeline.recipe import Recipe, StepSpec
from temper.pipeline.search import DEFAULT_MAX_TRIALS, OPTION_MODELS, SEARCHABLE


def recipe_schema() -> dict[str, Any]:
    schema = Recipe.model_json_schema(by_alias=True)
    defs = schema["$defs"]
    defs["StepSpec"] = {"anyOf": [{"enum": sorted(StepSpec.model_fields), "description": "a step with its defaults"},
                                  defs["StepSpec"]]}
    for kind, keys in SEARCHABLE.items():
        for model in OPTION_MODELS[kind]:
            _searchable(defs[model.__name__]["properties"], [key for key in keys if key in model.model_fields])
    defs["CandidateSpec"]["properties"]["max_trials"] = {
        "type": "integer", "minimum": 1, "default": DEFAULT_MAX_TRIALS,
        "description": "when step options list alternatives: build and validate at most this many combinations"}
    return schema


def _searchable(properties: dict[str, Any], keys: list[str]) -> None:
    """Each of `keys` in an options model's schema: its value, or a list of alternatives."""
    for key in keys:
        kept = {k: v for k, v in properties[key].items() if k in ("default", "description", "title")}
        one = {k: v for k, v in properties[key].items() if k not in kept}
        properties[key] = {**kept, "anyOf": [one, {"type": "array", "items": one, "minItems": 1}]}
