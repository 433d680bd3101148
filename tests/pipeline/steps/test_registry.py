"""The step registry, the recipe schema and the search tables describe the same steps: a step added
to one and missed in another fails here, not in a user's recipe. Also the layer rules the registry
relies on: the loader reads it without torch, and nothing imports back into the module it came from."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel

from temper.pipeline import quantize_backends, search, step_options
from temper.pipeline.recipe import Recipe, StepSpec
from temper.pipeline.schema import recipe_schema
from temper.pipeline.steps import (
    STEPS,
    candidate_precision,
    precision_of,
    searchable,
    uses_calibration,
    uses_evaluation,
)
from temper.pipeline.steps.base import Step
from tests.helpers import REPO

DIGITS = {"version": 1, "name": "r", "model": {"onnx": "m.onnx", "inputs": [{"name": "x", "shape": [1, 4]}],
                                                "outputs": ["y"]}}


def _spec(step: str | dict) -> StepSpec:
    return StepSpec.model_validate(step, context={"preset_choice": None})


def test_every_registered_step_is_a_recipe_step_with_its_own_options_model():
    """A step's options are one model, or (quantize) a tagged union of its backends' models: each lives in a
    recipe-contract module (pipeline/step_options.py, pipeline/quantize_backends/)."""
    assert set(STEPS) == set(StepSpec.model_fields)
    for name, step in STEPS.items():
        assert isinstance(step, Step) and step.name == name
        assert step.option_models() and all(issubclass(m, BaseModel) for m in step.option_models())
        assert StepSpec.model_fields[name].annotation == step.options_model | None, name
        for model in step.option_models():  # the core-contract modules
            home = step_options if model.__module__ == step_options.__name__ else quantize_backends
            assert getattr(home, model.__name__) is model, model


def test_the_schema_temper_prints_has_every_steps_options():
    schema = recipe_schema()
    defs, kinds = schema["$defs"], schema["$defs"]["StepSpec"]["anyOf"]
    assert sorted(kinds[0]["enum"]) == sorted(STEPS)
    for name, step in STEPS.items():
        for model in step.option_models():
            assert set(defs[model.__name__]["properties"]) == set(model.model_fields), name


def test_searchable_keys_are_scalar_fields_of_their_options_model():
    assert search.SEARCHABLE == searchable() and search.SEARCHABLE  # derived, and something is searchable
    assert search.OPTION_MODELS == {name: STEPS[name].option_models() for name in search.SEARCHABLE}
    defs = recipe_schema()["$defs"]
    for name, step in STEPS.items():
        assert len(set(step.searchable)) == len(step.searchable), name
        for key in step.searchable:
            holders = [m for m in step.option_models() if key in m.model_fields]
            assert holders, f"{name}.{key}"
            for model in holders:
                annotation = str(model.model_fields[key].annotation)
                assert "list" not in annotation and "dict" not in annotation, f"{name}.{key} is not a scalar"
                assert "array" in str(defs[model.__name__]["properties"][key]), \
                    f"temper schema does not offer a list for {name}.{key} ({model.__name__})"


def test_a_budget_option_is_a_field_and_decides_uses_evaluation():
    for name, step in STEPS.items():
        if step.budget_option is not None:
            assert any(step.budget_option in m.model_fields for m in step.option_models()), name
    assert uses_evaluation([_spec({"quantize": {"mode": "static", "fallback": {}}})])
    assert not uses_evaluation([_spec({"quantize": {"mode": "static"}}), _spec("fp16")])


@pytest.mark.parametrize(("steps", "expected"), [
    ([], "fp32"),
    (["simplify", {"fix_shapes": {"dims": {"batch": 1}}}], "fp32"),
    (["fp16"], "fp16"),
    ([{"quantize": {"mode": "static"}}], "int8-static"),
    ([{"quantize": {"mode": "dynamic"}}], "int8-dynamic"),
    (["fp16", {"quantize": {"mode": "dynamic"}}], "int8-dynamic"),
    ([{"quantize": {"mode": "static"}}, "fp16"], "int8-static"),  # FP16 after INT8 leaves INT8 weights
    ([{"quantize": {"mode": "static"}}, {"quantize": {"mode": "dynamic"}}], "int8-dynamic"),
])
def test_precision_comes_from_each_steps_declaration(steps, expected):
    specs = [_spec(s) for s in steps]
    assert precision_of(specs) == expected
    recipe = Recipe.model_validate({**DIGITS, "candidates": {"c": {"steps": steps or ["simplify"]}}},
                                   context={"preset_choice": None})
    assert candidate_precision(recipe, "c") == (expected if steps else "fp32")
    assert candidate_precision(recipe, "baseline") == "fp32"


def test_calibration_is_what_static_quantize_needs():
    assert uses_calibration([_spec({"quantize": {"mode": "static"}})])
    assert not uses_calibration([_spec({"quantize": {"mode": "dynamic"}}), _spec("fp16"), _spec("simplify")])


def test_the_loader_reads_the_registry_without_importing_torch():
    code = ("import sys, temper.pipeline.loading, temper.pipeline.steps; "
            "heavy = sorted({'torch', 'onnxsim'} & set(sys.modules)); assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120, cwd=REPO)


def _module_imports(path: Path) -> set[str]:
    """What a module imports when it is imported (TYPE_CHECKING blocks and function bodies aside)."""
    found: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def _all_imports(path: Path) -> set[str]:
    """Every module a file names in an import, function bodies included."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return found




def test_core_contracts_import_no_step_and_validators_only_core_contracts():
    core = {"pipeline/recipe.py", "pipeline/step_options.py", "pipeline/presets.py", "artifacts/core/errors.py"}
    for module in core:
        imported = _all_imports(REPO / module)
        assert not {m for m in imported if m.startswith(
            ("temper.pipeline.steps", "temper.pipeline.loading", "temper.pipeline.search"))}, module
        assert not {m for m in _module_imports(REPO / module) if m.startswith("temper.pipeline.steps")}, module
    scoring = _module_imports(REPO / "validators" / "scoring.py")
    assert not {m for m in scoring if m.startswith("temper.pipeline.steps")}


def test_search_and_loading_import_each_other_in_one_direction_only():
    everywhere = set()
    for node in ast.walk(ast.parse((REPO / "pipeline" / "search.py").read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            everywhere.add(node.module)
    assert "temper.pipeline.loading" not in everywhere
