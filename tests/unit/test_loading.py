"""pipeline.loading.describe: one pydantic error -> the key path the user wrote and a plain message."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from temper.pipeline.loading import describe
from temper.pipeline.recipe import Recipe

DIGITS = Path(__file__).resolve().parents[2] / "recipes" / "digits-cnn.yaml"


def _digits() -> dict[str, Any]:
    return yaml.safe_load(DIGITS.read_text())


def _first_error(data: dict[str, Any]) -> tuple[str, str]:
    with pytest.raises(ValidationError) as caught:
        Recipe.model_validate(data)
    return describe(caught.value.errors()[0], data)


def _quantize(data: dict[str, Any]) -> dict[str, Any]:
    return data["candidates"]["int8-static"]["steps"][0]["quantize"]


def test_the_digits_recipe_is_valid():
    Recipe.model_validate(_digits())  # the tests below each break one thing in it


def test_unknown_key_suggests_the_closest_valid_one():
    data = _digits()
    _quantize(data)["per_chanel"] = True
    assert _first_error(data) == ("candidates.int8-static.steps[0].quantize.per_chanel",
                                  "unknown key 'per_chanel' (did you mean 'per_channel'?)")


def test_unknown_top_level_key_uses_the_aliases_users_write():
    data = _digits()
    data["validat"] = data.pop("validate")
    assert _first_error(data) == ("validat", "unknown key 'validat' (did you mean 'validate'?)")


def test_unknown_key_with_nothing_close_lists_the_valid_keys():
    data = _digits()
    data["model"]["zzzzzz"] = 1
    key, message = _first_error(data)
    assert key == "model.zzzzzz" and message.startswith("unknown key 'zzzzzz' (valid keys: ")
    assert "factory" in message and "inputs" in message


def test_a_choice_outside_the_literal_lists_the_choices():
    data = _digits()
    _quantize(data)["calibration"] = "entrophy"
    assert _first_error(data) == ("candidates.int8-static.steps[0].quantize.calibration",
                                  "'entrophy' is not one of minmax, entropy, percentile")


def test_a_missing_key():
    data = _digits()
    del data["name"]
    assert _first_error(data) == ("name", "missing required key")


def test_a_wrong_type_shows_what_was_given():
    data = _digits()
    _quantize(data)["per_channel"] = "maybe"
    key, message = _first_error(data)
    assert key == "candidates.int8-static.steps[0].quantize.per_channel" and message.endswith("(got 'maybe')")


def test_a_validator_message_loses_pydantics_prefix():
    data = _digits()
    data["candidates"]["int8-dynamic"]["steps"][0]["quantize"]["format"] = "qdq"
    key, message = _first_error(data)
    assert key == "candidates.int8-dynamic.steps[0].quantize"
    assert message == "'format': only for mode: static"


def test_hand_made_errors_map_list_indexes_and_the_top_level():
    data = {"steps": [{"quantize": {}}]}
    error = {"type": "missing", "loc": ("steps", 0, "quantize", "mode"), "msg": "Field required", "input": {}}
    assert describe(error, data) == ("steps[0].quantize.mode", "missing required key")
    top = {"type": "model_type", "loc": (), "msg": "Input should be a valid dictionary", "input": [1]}
    assert describe(top, [1]) == ("(top level)", "Input should be a valid dictionary")


def test_internal_union_member_names_are_dropped_from_the_path():
    """pydantic names the union member it tried (here `QuantizeOptions`): the user never wrote that key."""
    data = {"steps": [{"quantize": {"mode": 3}}]}
    error = {"type": "int_type", "loc": ("steps", 0, "quantize", "QuantizeOptions", "mode"),
             "msg": "Input should be a valid string", "input": 3}
    assert describe(error, data) == ("steps[0].quantize.mode", "Input should be a valid string (got 3)")
