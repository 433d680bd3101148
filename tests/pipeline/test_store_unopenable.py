"""A tracking store that cannot be opened, through the console script: every command that reads or writes
the registry answers in one line, exit 3, within seconds. MLflow's client opened the store as it was built,
outside the check `run` and `check` made, and retries an sqlite file it cannot open for about 100 s: `pull`,
`serve models:/`, `export-triton models:/`, `validate --model` and `promote` printed a 129-678-line
traceback and exited 1 after 105 s, and `check` took 113 s to say it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.pipeline.test_cli_contract import one_line, temper, tiny_recipe

COMMANDS = {
    "pull": ["pull", "models:/tiny@candidate", "--dest", "bundle"],
    "serve": ["serve", "models:/tiny@candidate", "--port", "0"],
    "export-triton": ["export-triton", "models:/tiny@candidate", "--dest", "repo"],
    "promote": ["promote", "tiny", "1", "--alias", "champion"],
    "validate": ["validate", "recipe.yaml", "--model", "models:/tiny@candidate", "--output", "out"],
    "check": ["check", "recipe.yaml"],
    "run": ["run", "recipe.yaml", "--output", "out"],
}


def _store(folder: Path, kind: str) -> str:
    if kind == "folder":  # sqlite:/// naming a folder
        (folder / "store").mkdir()
        return f"sqlite:///{folder / 'store'}"
    if kind == "not-a-database":
        (folder / "notes.db").write_text("these are not the tables you are looking for\n" * 20)
        return f"sqlite:///{folder / 'notes.db'}"
    (folder / "afile").write_text("x")  # a store whose path runs through a file
    if kind == "under-a-file":
        return f"sqlite:///{folder / 'afile' / 'mlflow.db'}"
    return (folder / "afile" / "mlruns").as_uri()


@pytest.mark.parametrize("kind", ["folder", "not-a-database", "under-a-file", "file-store-under-a-file"])
@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_store_that_cannot_be_opened_is_one_line_exit_3_at_once(tmp_path: Path, command: str, kind: str) -> None:
    tiny_recipe(tmp_path, validate={"accuracy": {"metric": "top1", "max_drop": 0.5}},
                publish={"mlflow": {"registered_model": "tiny"}})
    uri = _store(tmp_path, kind)
    began = time.monotonic()
    result = temper(*COMMANDS[command], "--tracking-uri", uri, cwd=tmp_path)
    took = time.monotonic() - began
    assert result.returncode == 3, (result.returncode, result.stderr[-3000:])
    line = one_line(result)
    assert line.startswith(f"error: the MLflow store {uri} does not answer (") and "--tracking-uri" in line, line
    assert took < 30, took  # MLflow's own retries took 105 s
    assert not any((tmp_path / name).exists() for name in ("bundle", "repo", "out"))
