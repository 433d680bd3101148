"""Load a user's `path/to/file.py:function` by file path, so a recipe's own code works from anywhere."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import io
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from temper.artifacts.core.errors import RecipeError, first_line


def split_ref(ref: str, base: Path) -> tuple[Path, str]:
    file, _, function = ref.rpartition(":")
    return (base / file).resolve(), function


def load_callable(ref: str, base: Path, recipe_file: str, key: str) -> Callable[..., Any]:
    """Import the file as a fresh module (its folder on sys.path for sibling imports) and return the function."""
    path, function = split_ref(ref, base)
    if not path.is_file():
        raise RecipeError(recipe_file, key,
                          f"file '{path}' not found (paths are relative to the recipe's folder {base})")
    name = "temper_user_" + hashlib.sha256(str(path).encode()).hexdigest()[:12]
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        with _boundary(recipe_file, key, f"importing {path.name}", path):
            spec.loader.exec_module(module)
        sys.modules[name] = module
    target = getattr(module, function, None)
    if not callable(target):
        found = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        raise RecipeError(recipe_file, key,
                          f"{path.name} has no function '{function}' (it has: {', '.join(found) or 'none'})")
    return target


def call_user(fn: Callable[..., Any], recipe_file: str, key: str, *args: Any) -> Any:
    """Call user code; whatever ends it (an exception, sys.exit, KeyboardInterrupt) becomes one line
    naming the recipe key that pointed at it."""
    with _boundary(recipe_file, key, f"{getattr(fn, '__name__', 'the function')}()", Path(fn.__code__.co_filename)
                   if hasattr(fn, "__code__") else None):
        return fn(*args)


@contextlib.contextmanager
def _folder_on_path(path: Path | None) -> Iterator[None]:
    """The user file's folder first on sys.path for as long as its code runs, and only then: a factory
    that imports a sibling module inside the function (heavy dependencies often are) finds it, and
    temper's own imports never see the user's folder."""
    folder = str(path.parent) if path else None
    if folder is None:
        yield
        return
    sys.path.insert(0, folder)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):  # user code may have removed it itself
            sys.path.remove(folder)


@contextlib.contextmanager
def _boundary(recipe_file: str, key: str, what: str, path: Path | None) -> Iterator[None]:
    """Run user code as a library call, not a program: sys.argv is only its own file's name (an
    argparse at import sees no temper options), and nothing it raises may end temper silently,
    least of all `sys.exit(0)`, which a CI job would read as a pass."""
    argv = sys.argv
    sys.argv = [str(path) if path else "user-code"]
    said = io.StringIO()  # what it writes to stderr: an argparse usage text is not temper's to print
    try:
        with contextlib.redirect_stderr(said), _folder_on_path(path):
            yield
    except SystemExit as exc:
        last = [line for line in said.getvalue().splitlines() if line.strip()][-1:]
        raise RecipeError(recipe_file, key, f"{what} called sys.exit({exc.code!r})"
                          + (f" ({last[0].strip()})" if last else "")
                          + ": user code must return or raise, not end the process") from None
    except KeyboardInterrupt:
        raise RecipeError(recipe_file, key, f"{what} was interrupted (KeyboardInterrupt)") from None
    except RecipeError:
        raise
    except Exception as exc:  # the user's code: report it, don't crash with its traceback
        raise RecipeError(recipe_file, key, f"{what} raised {first_line(exc)}") from exc
    finally:
        sys.argv = argv
