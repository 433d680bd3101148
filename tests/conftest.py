"""Shared fixtures: an isolated step cache per test, the `temper` CLI in-process, recipe copies."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RECIPES = REPO / "recipes"


@dataclass
class CliResult:
    code: int
    stdout: str
    stderr: str


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own empty step cache unless it shares one on purpose."""
    root = tmp_path_factory.mktemp("cache")
    monkeypatch.setenv("TEMPER_CACHE_DIR", str(root))
    return root


@pytest.fixture(autouse=True)
def tracking_store(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> str:
    """A private MLflow sqlite store per test: no test publishes into the working folder's mlflow.db."""
    uri = f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


@pytest.fixture
def temper(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Callable[..., CliResult]:
    """Run the CLI entry point in-process (same code path as the console script) and capture it."""
    from pipeline.cli import main

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
