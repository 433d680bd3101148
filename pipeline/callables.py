"""Load a user's `path/to/file.py:function` by file path, so a recipe's own code works from anywhere."""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline.errors import RecipeError, first_line


def split_ref(ref: str, base: Path) -> tuple[Path, str]:
    file, _, function = ref.rpartition(":")
    return (base / file).resolve(), function


def load_callable(ref: str, base: Path, recipe_file: str, key: str) -> Callable[..., Any]:
    """Import the file as a fresh module (its folder on sys.path for sibling imports) and return the function."""
    path, function = split_ref(ref, base)
    if not path.is_file():
        raise RecipeError(recipe_file, key, f"file '{path}' not found (paths are relative to the recipe's folder {base})")
    name = "temper_user_" + hashlib.sha256(str(path).encode()).hexdigest()[:12]
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.path.insert(0, str(path.parent))
        try:
            spec.loader.exec_module(module)
        except Exception as exc:  # the user's code: report it, don't crash with its traceback
            raise RecipeError(recipe_file, key, f"importing {path.name} raised {first_line(exc)}") from exc
        finally:
            sys.path.remove(str(path.parent))
        sys.modules[name] = module
    target = getattr(module, function, None)
    if not callable(target):
        found = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        raise RecipeError(recipe_file, key, f"{path.name} has no function '{function}' (it has: {', '.join(found) or 'none'})")
    return target


def call_user(fn: Callable[..., Any], recipe_file: str, key: str, *args: Any) -> Any:
    """Call user code; any exception becomes one line naming the recipe key that pointed at it."""
    try:
        return fn(*args)
    except Exception as exc:
        raise RecipeError(recipe_file, key, f"{fn.__name__}() raised {first_line(exc)}") from exc
