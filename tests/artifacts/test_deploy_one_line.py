"""`temper serve` of a repository and `temper export-triton`, through the console script: what the user got
wrong is one line naming the flag (or the repository) and exit 2, never uvicorn's log, a raw exception
name, or a repository written without its manifests. (`check` against an sqlite store that is a folder:
tests/pipeline/test_store_unopenable.py.)"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.artifacts.repositories import make_repository
from tests.pipeline.test_cli_contract import temper


def _error(result: subprocess.CompletedProcess[str]) -> str:
    """Exit 2 and one error line; other stderr lines may only be warnings (a bundle without a manifest)."""
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip() and not line.startswith("warning: ")]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def test_a_repository_whose_newest_version_is_broken_is_one_line_exit_2(tmp_path: Path) -> None:
    """It printed `serving ...`, then uvicorn's `ERROR: cannot start: ...` and `Application startup failed`,
    and exited 3."""
    repo = make_repository(tmp_path)
    broken = repo / "tiny" / "3"
    broken.mkdir()
    for file in (repo / "tiny" / "2").iterdir():
        (broken / file.name).write_bytes(file.read_bytes())
    (broken / "model.onnx").write_bytes(b"not a model")
    line = _error(temper("serve", repo, "--port", "0"))
    assert line.startswith(f"error: {repo}: failed to load 'tiny' version 3: DecodeError"), line
    assert "ERROR" not in temper("serve", repo, "--port", "0").stderr


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    return make_repository(tmp_path) and tmp_path / "bundle-tiny-0"


@pytest.mark.parametrize("where", ["file", "under-a-file", "foreign-model-folder"])
def test_export_triton_names_dest_for_a_destination_it_cannot_use(tmp_path: Path, bundle: Path, where: str) -> None:
    """They were `MODEL: FileExistsError: ...` and `MODEL: NotADirectoryError: ...`."""
    (tmp_path / "afile").write_text("x")
    dest = {"file": tmp_path / "afile", "under-a-file": tmp_path / "afile" / "repo",
            "foreign-model-folder": tmp_path / "d"}[where]
    if where == "foreign-model-folder":
        (dest / "tiny").mkdir(parents=True)
        (dest / "tiny" / "notes.txt").write_text("mine")
    line = _error(temper("export-triton", bundle, "--dest", dest))
    assert line.startswith(f"error: {dest}: --dest: "), line
    assert "Error:" not in line, line  # no raw exception name
    assert {"file": "is a file, not a folder", "under-a-file": "lies under", "foreign-model-folder":
            "exists and temper did not write it"}[where] in line, line


@pytest.mark.parametrize("where", ["file", "foreign-model-folder"])
def test_manifests_it_cannot_write_are_refused_before_the_repository_is_written(
        tmp_path: Path, bundle: Path, where: str) -> None:
    """`--manifests` that is a file wrote the repository, then exited 2 with a raw exception: half-written."""
    manifests, dest = tmp_path / "k8s", tmp_path / "repo-out"
    if where == "file":
        manifests.write_text("x")
    else:
        (manifests / "tiny").mkdir(parents=True)
        (manifests / "tiny" / "mine.yaml").write_text("kind: Mine\n")
    line = _error(temper("export-triton", bundle, "--dest", dest, "--manifests", manifests))
    assert line.startswith(f"error: {manifests}: --manifests: "), line
    assert not dest.exists()
