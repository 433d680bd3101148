"""A search must never replace a candidate: names shared with an explicit candidate or another search,
and alternatives listed twice, are one line and exit 2 at `temper check` (so at `temper run` too)."""

from __future__ import annotations

import pytest

from tests.helpers import edit_recipe


def _assert_one_line(result, recipe, key: str, *fragments: str) -> None:
    assert result.code == 2, (result.code, result.stdout, result.stderr)
    line = result.stderr.strip()
    assert "\n" not in line and "Traceback" not in line, result.stderr
    assert line.startswith(f"error: {recipe}: {key}: "), line
    for fragment in fragments:
        assert fragment in line, line


def _searched(formats: list[str]) -> dict:
    return {"steps": [{"quantize": {"mode": "static", "format": formats}}]}


@pytest.mark.parametrize("explicit_first", [True, False])
def test_a_search_combination_named_like_an_explicit_candidate_is_refused(temper, digits_dir, explicit_first):
    recipe = digits_dir / "digits-cnn.yaml"
    explicit = {"steps": [{"quantize": {"mode": "dynamic"}}]}

    def change(d: dict) -> None:
        pairs = [("int8.format-qdq", explicit), ("int8", _searched(["qdq", "qoperator"]))]
        d["candidates"] = dict(pairs if explicit_first else pairs[::-1])

    edit_recipe(recipe, change)
    later = "int8" if explicit_first else "int8.format-qdq"
    for command in ("check", "run"):
        _assert_one_line(temper(command, recipe), recipe, f"candidates.{later}", "'int8.format-qdq' is both",
                         "the candidate candidates.int8.format-qdq", "a combination of the search candidates.int8",
                         "rename one of them")


def test_two_searches_producing_the_same_name_are_refused(temper, digits_dir):
    recipe = digits_dir / "digits-cnn.yaml"
    edit_recipe(recipe, lambda d: d.update(candidates={
        "a": {"steps": [{"quantize": {"mode": "static", "format": ["qdq", "qoperator"],
                                      "per_channel": [True, False]}}]},
        "a.format-qdq": {"steps": [{"quantize": {"mode": "static", "per_channel": [True, False]}}]}}))
    _assert_one_line(temper("check", recipe), recipe, "candidates.a.format-qdq",
                     "'a.format-qdq.per_channel-true' is both a combination of the search candidates.a "
                     "and a combination of the search candidates.a.format-qdq")


@pytest.mark.parametrize(("key", "values", "position", "shown"), [
    ("format", ["qdq", "qdq"], 1, "'qdq'"),
    ("per_channel", [True, False, True], 2, "True"),
])
def test_an_alternative_listed_twice_is_refused(temper, digits_dir, key, values, position, shown):
    recipe = digits_dir / "digits-cnn.yaml"
    edit_recipe(recipe, lambda d: d["candidates"].update(
        {"int8": {"steps": [{"quantize": {"mode": "static", key: values}}]}}))
    at = f"candidates.int8.steps[0].quantize.{key}"
    for command in ("check", "run"):
        _assert_one_line(temper(command, recipe), recipe, f"{at}[{position}]", f"{shown} is listed twice",
                         f"also at {at}[0]", "remove the repeat")


def test_distinct_alternatives_and_names_still_load(digits_dir):
    from temper.pipeline.loading import load_recipe

    recipe = digits_dir / "digits-cnn.yaml"
    edit_recipe(recipe, lambda d: d["candidates"].update(
        {"int8": _searched(["qdq", "qoperator"]),
         "int8.format-qdq-dynamic": {"steps": [{"quantize": {"mode": "dynamic"}}]}}))
    loaded = load_recipe(recipe)
    assert loaded.searches["int8"].trials == ["int8.format-qdq", "int8.format-qoperator"]
    assert {"int8.format-qdq", "int8.format-qoperator", "int8.format-qdq-dynamic"} <= set(loaded.recipe.candidates)
