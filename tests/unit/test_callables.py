"""artifacts.core.callables: the user's folder is on sys.path while the user's code runs, and only then."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from temper.artifacts.core.callables import call_user, load_callable
from temper.artifacts.core.errors import RecipeError

FACTORY = '''
def make():
    import sibling_helper  # imported inside the function, as factories with heavy dependencies do
    return sibling_helper.VALUE
'''


def test_a_factory_imports_a_sibling_module_inside_the_function(tmp_path: Path) -> None:
    (tmp_path / "sibling_helper.py").write_text("VALUE = 42\n")
    (tmp_path / "factory.py").write_text(FACTORY)
    fn = load_callable("factory.py:make", tmp_path, "recipe.yaml", "model.factory")
    assert str(tmp_path) not in sys.path
    try:
        assert call_user(fn, "recipe.yaml", "model.factory") == 42
    finally:
        sys.modules.pop("sibling_helper", None)
    assert str(tmp_path) not in sys.path


def test_the_folder_leaves_sys_path_when_the_user_code_raises(tmp_path: Path) -> None:
    (tmp_path / "factory.py").write_text("def make():\n    import no_such_sibling\n")
    fn = load_callable("factory.py:make", tmp_path, "recipe.yaml", "model.factory")
    with pytest.raises(RecipeError, match="No module named 'no_such_sibling'"):
        call_user(fn, "recipe.yaml", "model.factory")
    assert str(tmp_path) not in sys.path
