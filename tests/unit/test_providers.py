"""The provider table is the one list: the recipe's `Provider` values, the rows every layer reads, and
the serving runtime's order of preference must name the same providers."""

from __future__ import annotations

from typing import get_args

import pytest

from temper.artifacts.providers import BEST_FIRST, CPU, PROVIDERS, Provider, named
from temper.pipeline.recipe import Recipe


def test_the_literal_and_the_table_name_the_same_providers():
    assert get_args(Provider) == tuple(PROVIDERS)
    assert sorted(BEST_FIRST) == sorted(PROVIDERS) and BEST_FIRST[-1] == "cpu"
    assert all(info.name == key for key, info in PROVIDERS.items())


def test_the_recipe_schema_offers_exactly_the_table():
    schema = Recipe.model_json_schema(by_alias=True)
    providers = schema["$defs"]["ThroughputSpec"]["properties"]["providers"]["items"]
    assert providers["enum"] == list(PROVIDERS)


@pytest.mark.parametrize("name", list(PROVIDERS))
def test_every_gpu_provider_says_what_to_install(name):
    info = PROVIDERS[name]
    assert info.gpu == bool(info.install), "a provider this onnxruntime may lack says how to get it"
    assert named(info.ort) == name


def test_an_unknown_ort_provider_counts_as_cpu():
    assert named("SomeOtherExecutionProvider") == "cpu" and named(CPU) == "cpu"
