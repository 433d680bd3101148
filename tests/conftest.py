"""Shared fixtures: an isolated step cache per test, the `temper` CLI in-process, recipe copies."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import RECIPES, CliResult, edit_recipe


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own empty step cache unless it shares one on purpose."""
    root = tmp_path_factory.mktemp("cache")
    monkeypatch.setenv("TEMPER_CACHE_DIR", str(root))
    return root


@pytest.fixture(autouse=True)
def tracking_store(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A private MLflow sqlite store per test: no test publishes into the working folder's mlflow.db.
    Afterwards MLflow's process-wide tracking and registry targets are forgotten: `temper publish` run
    in-process sets them (artifacts/registry.connect), and a later test of the same process (an xdist
    worker runs hundreds) would otherwise register its models into this test's store."""
    uri = f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.delenv("MLFLOW_REGISTRY_URI", raising=False)
    yield uri
    tracking = sys.modules.get("mlflow.tracking._tracking_service.utils")
    registry = sys.modules.get("mlflow.tracking._model_registry.utils")
    if tracking is not None:
        tracking._tracking_uri = None  # MLflow's unset default
    if registry is not None:
        registry._registry_uri = None
    os.environ.pop("MLFLOW_REGISTRY_URI", None)  # set_registry_uri sets it; monkeypatch then restores any before


@pytest.fixture
def temper(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Callable[..., CliResult]:
    """Run the CLI entry point in-process (same code path as the console script) and capture it."""
    from temper.pipeline.cli import main

    def invoke(*args: str) -> CliResult:
        capsys.readouterr()
        monkeypatch.setattr(sys, "argv", ["temper", *map(str, args)])
        try:
            main()
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return invoke


@pytest.fixture
def digits_dir(tmp_path: Path) -> Path:
    """A private copy of the digits recipe and the files it uses, safe to edit."""
    folder = tmp_path / "recipes"
    folder.mkdir()
    for name in ("digits-cnn.yaml", "digits_model.py", "digits_data.py", "digits_cnn.pt"):
        shutil.copy2(RECIPES / name, folder / name)
    return folder


@pytest.fixture(scope="module")
def module_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A step cache the tests of one module share on purpose: they build on each other's models."""
    return tmp_path_factory.mktemp("module-cache")


@pytest.fixture
def gated_digits(digits_dir: Path, module_cache: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The digits recipe with quick throughput slices and a speed budget that holds on a loaded
    2-core machine (INT8 static measures 1.6-2.5x when quiet); dynamic INT8 at 0.1-0.3x still fails it."""
    monkeypatch.setenv("TEMPER_CACHE_DIR", str(module_cache))
    recipe = digits_dir / "digits-cnn.yaml"
    edit_recipe(recipe, lambda d: d["validate"]["throughput"].update(duration_s=0.6, warmup_s=0.1, min_speedup=0.8))
    return recipe


class _TreeMemory:
    """The peak resident memory of the whole run: this process and every process under it (pytest-xdist
    workers, servers, `temper` subprocesses), summed, sampled every half second. A process's own
    ru_maxrss misses what its children hold at the same time, and the machine holds the sum."""

    def __init__(self) -> None:
        import threading

        self.peak = 0
        threading.Thread(target=self._sample, daemon=True, name="tree-memory").start()

    def _sample(self) -> None:
        import time

        import psutil

        me = psutil.Process()
        while True:
            total = 0
            for process in [me, *me.children(recursive=True)]:
                try:
                    total += process.memory_info().rss
                except psutil.Error:  # ended between the listing and the reading
                    pass
            self.peak = max(self.peak, total)
            time.sleep(0.5)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto` (pyproject's addopts): two workers, or one on a single usable core. More would not fit the
    suite's memory target (under 4 GiB: a worker running a digits build holds about 1.5 GiB)."""
    from temper.artifacts.core.host import usable_cores

    return min(2, usable_cores())


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist) samples the tree
        config.stash[_MEMORY] = _TreeMemory()


HEAVY_FILES = ("test_minilm_", "test_smollm2_")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark `heavy` every test that loads a model of GiBs: MiniLM (those sharing its step cache, and
    tests/recipes/test_minilm_*.py) and SmolLM2 (tests/recipes/test_smollm2_*.py). make test runs them in a
    pytest process of their own, after the others ran two at a time (`-n 2`), so that their GiBs never sit
    beside another test's."""
    for item in items:
        if "minilm_cache" in getattr(item, "fixturenames", ()) or item.path.name.startswith(HEAVY_FILES):
            item.add_marker(pytest.mark.heavy)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """Print this pytest run's peak resident memory, so CI shows whether the suite still fits its machine
    (2 cores, 24 GiB shared; target: under 4 GiB). make test's two runs follow each other, so the
    suite's peak is the larger of the two lines."""
    memory = config.stash.get(_MEMORY, None)
    if memory is not None:
        terminalreporter.write_sep("-", f"peak RSS of this pytest run (every process, summed): "
                                        f"{memory.peak / 2**30:.2f} GiB")


_MEMORY = pytest.StashKey[_TreeMemory]()


@pytest.fixture(scope="session")
def minilm_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One step cache for the slow MiniLM tests of a run: MiniLM's export and simplify (a minute or more
    and GiBs each) are built once instead of once per test. Steps are content-addressed, so a test that
    changes an option still builds its own step; sharing changes no result."""
    return tmp_path_factory.mktemp("minilm-cache")
