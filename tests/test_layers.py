"""The one layer rule everything else leans on: artifacts/ (the serving runtime MLflow models ship
as code) imports nothing from the rest of temper, at module level or inside a function."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OTHER_PACKAGES = ("pipeline", "validators", "calibration", "benchmarks", "tests")


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def test_artifacts_import_nothing_outside_themselves():
    offenders = {str(path.relative_to(REPO)): sorted(name for name in _imports(path)
                                                       if name.split(".")[0] in OTHER_PACKAGES)
                 for path in sorted((REPO / "artifacts").glob("*.py"))}
    assert {file: names for file, names in offenders.items() if names} == {}
