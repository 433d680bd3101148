"""The layers docs/architecture.md names, checked on the source so a change that crosses
one fails here, not in a review. The top-level folders are the layers, bottom first:

    artifacts/    ships inside every MLflow model, and holds what every layer shares: errors,
                  ONNX file helpers, the user-code boundary, the recipe's base model
    calibration/  data sources (and their recipe models)
    validators/   gates, evaluation, reports (and the recipe's validate: models)
    pipeline/     recipe, steps, search, runner, flow, outputs, publishing, the CLI

A folder imports only itself and the folders below it, so no two folders import each other.
artifacts/ is itself floors (ARTIFACT_FLOORS, bottom first): each sub-package imports only itself and the
ones below, and no module sits beside them, so a newcomer finds the server under serving/.
Inside pipeline/, the recipe contracts (recipe, step_options, presets, quantize_backends/) import nothing
else of pipeline/. Plus: no import cycle between modules, and no module over MAX_LINES, benchmarks/ included.
Imports inside functions count (a cycle hidden in a function is still a cycle); those under
`if TYPE_CHECKING:` do not, since they never run.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("artifacts", "pipeline", "calibration", "validators")
LAYERS = ("artifacts", "calibration", "validators", "pipeline")  # bottom first
MAX_LINES = 400
ARTIFACT_FLOORS = ("core", "engines", "formats", "triton", "serving", "registry")  # bottom first


def _module_name(path: Path) -> str:
    """Installed name: the folder pipeline/ is the package temper.pipeline (pyproject's package-dir)."""
    parts = ("temper", *path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for package in PACKAGES for p in sorted((REPO / package).rglob("*.py"))}
# the quantize backends' package is a contract too: each backend's module holds its options model, which the
# recipe's quantize step is the union of (its libraries are imported inside the backend's functions)
CONTRACTS = {f"temper.pipeline.{name}" for name in ("recipe", "step_options", "presets")} | {
    name for name in MODULES if name.startswith("temper.pipeline.quantize_backends")}


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped |= {id(inner) for child in node.body for inner in ast.walk(child)}
    return skipped


def _resolve(name: str) -> str | None:
    """The temper module an imported dotted name lives in (a module, or a name inside one)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports(module: str) -> set[str]:
    """The temper modules `module` imports at run time."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(), str(path))
    skipped = _type_checking_nodes(tree)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names = [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        found |= {target for name in names if (target := _resolve(name)) and target != module}
    return found


GRAPH = {module: imports(module) for module in MODULES}


def _top(module: str) -> str:
    """The top-level folder a module lives in: temper.pipeline.flow -> pipeline."""
    return module.split(".")[1]


def _offenders(importers: set[str], allowed) -> dict[str, list[str]]:
    found = {m: sorted(t for t in GRAPH[m] if not allowed(t)) for m in sorted(importers)}
    return {m: names for m, names in found.items() if names}


def test_each_folder_imports_only_itself_and_the_folders_below():
    rank = {top: i for i, top in enumerate(LAYERS)}
    assert set(PACKAGES) == set(LAYERS)
    found = {m: sorted(t for t in GRAPH[m] if rank[_top(t)] > rank[_top(m)]) for m in sorted(MODULES)}
    assert {m: names for m, names in found.items() if names} == {}


def test_no_two_folders_import_each_other():
    """The folder graph, as a reader of the tree sees it: every edge points down, none both ways."""
    edges = {(_top(m), _top(t)) for m in MODULES for t in GRAPH[m] if _top(m) != _top(t)}
    assert {(a, b) for a, b in edges if (b, a) in edges} == set()


def _floor(module: str) -> str | None:
    """artifacts' sub-package of a module: temper.artifacts.serving.server -> serving; None elsewhere."""
    parts = module.split(".")
    return parts[2] if parts[1] == "artifacts" and len(parts) > 2 else None


def test_artifacts_is_sub_packages_only():
    assert sorted(p.name for p in (REPO / "artifacts").glob("*.py")) == ["__init__.py"]
    assert {p.name for p in (REPO / "artifacts").iterdir() if p.is_dir() and p.name != "__pycache__"} == set(
        ARTIFACT_FLOORS)


def test_each_artifacts_floor_imports_only_itself_and_the_floors_below():
    rank = {floor: i for i, floor in enumerate(ARTIFACT_FLOORS)}
    found = {m: sorted(t for t in GRAPH[m] if (floor := _floor(t)) and rank[floor] > rank[_floor(m) or "core"])
             for m in sorted(MODULES) if _floor(m)}
    assert {m: names for m, names in found.items() if names} == {}


def test_recipe_contracts_import_nothing_else_of_pipeline():
    """recipe, step_options and presets are read by the loader, the steps and the CLI alike."""
    assert CONTRACTS <= set(MODULES)
    assert _offenders(CONTRACTS, lambda t: t in CONTRACTS or _top(t) != "pipeline") == {}


def test_no_import_cycles():
    """Tarjan's strongly connected components over the module graph: every component is one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in GRAPH[module]:
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while (top := stack.pop()) != module:
                component.append(top)
            if component:
                cycles.append(sorted([module, *component]))

    for module in MODULES:
        if module not in index:
            visit(module)
    assert cycles == []


@pytest.mark.parametrize("top", ["artifacts", "pipeline", "calibration", "validators", "tests", "benchmarks"])
def test_modules_stay_small(top: str):
    """A module past MAX_LINES does several things; split it by what it does."""
    sizes = {str(p.relative_to(REPO)): len(p.read_text().splitlines()) for p in sorted((REPO / top).rglob("*.py"))}
    assert {path: lines for path, lines in sizes.items() if lines > MAX_LINES} == {}


CLI_MAX_LINES = 50


def test_the_cli_only_parses_and_prints():
    """No function in pipeline/cli/ over CLI_MAX_LINES: a command parses its flags and hands over to a module
    that does the work (servers.py, exporting.py, benching.py, ...), so what it does can be read and tested."""
    long = {}
    for path in sorted((REPO / "pipeline" / "cli").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > CLI_MAX_LINES:
                    long[f"{path.name}:{node.name}"] = lines
    assert long == {}


def test_tests_import_helpers_not_conftest():
    """Shared test code is tests/helpers.py; a conftest holds fixtures and hooks, which pytest finds itself."""
    found = [str(p.relative_to(REPO)) for p in sorted((REPO / "tests").rglob("*.py"))
             if re.search(r"^\s*from tests(\.\w+)*\.conftest import", p.read_text(), re.M)]
    assert found == []


def test_benchmarks_run_as_modules():
    """`python -m benchmarks.NAME` from the repository's root: no benchmark edits sys.path to find temper or
    its neighbours (the editable install and the package do that)."""
    assert (REPO / "benchmarks" / "__init__.py").is_file()
    assert [p.name for p in sorted((REPO / "benchmarks").glob("*.py")) if "sys.path.insert" in p.read_text()] == []


def test_the_mlflow_model_declares_every_package_its_code_imports():
    """A published model is artifacts/ code run where only its pinned requirements are installed:
    each third-party package the modules pyfunc loads import must be in artifacts.registry.pyfunc.REQUIREMENTS."""
    import subprocess
    import sys

    # the declared list comes from the same process: pytest itself then never pays mlflow's import (9 s)
    code = ("import sys, warnings; warnings.simplefilter('ignore'); import temper.artifacts.registry.pyfunc; "
            "print(' '.join(m for m in sys.modules if m.startswith('temper.artifacts'))); "
            "print(' '.join(temper.artifacts.registry.pyfunc.REQUIREMENTS)); "
            "from temper.artifacts.engines import ENGINES; "
            "print(' '.join(p for engine in ENGINES.values() for p in engine.packages))")
    lines = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO,
                           timeout=120).stdout.splitlines()
    loaded, requirements, by_engine = lines[-3].split(), lines[-2].split(), lines[-1].split()
    packages = set()
    for module in loaded:
        tree = ast.parse(MODULES[module].read_text())
        skipped = _type_checking_nodes(tree)
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            if isinstance(node, ast.Import):
                packages |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                packages.add(node.module.split(".")[0])
    third_party = packages - set(sys.stdlib_module_names) - {"temper"}
    # an engine's package (openvino) is required by exactly the models selected on that engine
    assert requirements and third_party - set(requirements) - set(by_engine) == set()
    assert set(by_engine) <= third_party, "an engine requirement the code does not import"
