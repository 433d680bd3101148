"""A bare `pip install temper-ml` (no `cpu` or `gpu` extra) has no ONNX Runtime: every command, `--help`
included, then ends in one line naming the fix and exit 3, never an ImportError traceback.

The commands import ONNX Runtime as they are registered (their modules build sessions), so the check runs
when the `temper.pipeline.cli` package is imported, before any of them: the console script, `python -c
"from temper.pipeline.cli import main"` and the serving subprocesses all go through it. `temper --version`
reads package metadata only, so it answers without ONNX Runtime.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import sys

from temper.artifacts.core.errors import first_line
from temper.artifacts.core.versions import NONE_INSTALLED, REINSTALL

EXIT_ENVIRONMENT = 3  # artifacts.core.errors.EnvironmentProblem's code


def problem() -> str | None:
    """Why ONNX Runtime cannot be imported here, in one line naming the fix; None when it can."""
    try:
        importlib.import_module("onnxruntime")
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] == "onnxruntime":
            return NONE_INSTALLED
        return f"onnxruntime does not import ({first_line(exc)}): {REINSTALL}"
    except ImportError as exc:  # installed, but its native libraries do not load
        return f"onnxruntime does not import ({first_line(exc)}): {REINSTALL}"
    return None


def exit_without_runtime(argv: list[str] | None = None) -> None:
    """Exit 3 with `error: <why>` on stderr when ONNX Runtime cannot be imported (`temper --version` still
    prints the version); return otherwise."""
    found = problem()
    if found is None:
        return
    args = sys.argv[1:] if argv is None else argv
    if args == ["--version"]:
        print(f"temper {importlib.metadata.version('temper-ml')}")
        sys.exit(0)
    print(f"error: {found}", file=sys.stderr)
    sys.exit(EXIT_ENVIRONMENT)
