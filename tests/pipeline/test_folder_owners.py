"""A folder one temper command wrote is never replaced or written into by another, through the console script:
`export-triton --manifests` never in, around or equal to its repository, `pull --dest` replaces only an earlier
pull's folder, and an export never writes into a folder some other command owns (a run's output folder, which
the next `temper run` replaces whole). Each refusal is one stderr line naming the flag, exit 2, nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest

from temper.artifacts.formats.bundle import config_for, write
from tests.pipeline.test_cli_contract import files, one_line, temper, tiny_model, tiny_recipe

GATED = {"validate": {"accuracy": {"metric": "top1", "max_drop": 0.5}}}


def _bundle(folder: Path, name: str = "tiny") -> Path:
    model = tiny_model(folder.parent / f"{folder.name}-src" / "model.onnx")
    return write(folder, model, config_for(model, name))


def _refused(result, start: str, *fragments: str) -> str:
    assert result.returncode == 2, result.stderr
    line = one_line(result)
    assert line.startswith(start) and all(f in line for f in fragments), line
    return line


# -- 1. export-triton --manifests never equal to, inside or around the repository --------------------------------


@pytest.mark.parametrize("where", ["the-repository", "inside-it", "inside-the-model-folder", "around-it"])
def test_export_triton_refuses_manifests_in_around_or_equal_to_the_repository(tmp_path: Path, where: str) -> None:
    """`--manifests REPO` replaced the model folder it had just written (every version, config.pbtxt) with the
    three Kubernetes files, exit 0; inside REPO, Triton and `temper serve REPO` take the folder for a model."""
    bundle, repo = _bundle(tmp_path / "bundle"), tmp_path / "shared" / "repo"
    for version in ("1", "2"):
        done = temper("export-triton", bundle, "--dest", repo, "--version", version, "--kind", "KIND_CPU")
        assert done.returncode == 0, done.stderr
    manifests = {"the-repository": repo, "inside-it": repo / "k8s", "inside-the-model-folder": repo / "tiny",
                 "around-it": tmp_path / "shared"}[where]
    before = files(tmp_path)
    result = temper("export-triton", bundle, "--dest", repo, "--version", "3", "--manifests", manifests)
    _refused(result, f"error: {manifests}: --manifests: ", "beside the repository")
    assert files(tmp_path) == before
    assert sorted(p.name for p in tmp_path.rglob("*") if p.name.startswith(".") and "partial" in p.name) == []


# -- 2. pull --dest replaces only an earlier pull's folder ----------------------------------------------------------


@pytest.mark.slow
def test_pull_replaces_no_folder_another_command_wrote(tmp_path: Path) -> None:
    """Any folder with temper's marker was replaced whole: a run's output folder, a Triton model folder with its
    versions, a manifests folder. The marker says which command wrote it; only an earlier pull's is replaced."""
    recipe = tiny_recipe(tmp_path, **GATED, publish={"mlflow": {"registered_model": "tiny"}})
    out, repo = tmp_path / "out", tmp_path / "repo"
    assert temper("run", recipe, "--output", out).returncode == 0
    exported = temper("export-triton", out, "--dest", repo, "--kind", "KIND_CPU")
    assert exported.returncode == 0, exported.stderr
    theirs = {out: "`temper run`", repo / "tiny": "`temper export-triton`",
              tmp_path / "repo-kubernetes" / "tiny": "`temper export-triton`"}
    before = files(tmp_path)
    for folder, command in theirs.items():
        _refused(temper("pull", "models:/tiny/1", "--dest", folder), f"error: {folder}: --dest: ",
                 f"was written by {command}", "not an earlier `temper pull`")
    for inside in (out / "bundle", repo / "tiny" / "9"):  # lost when that command replaces its folder (#36.3)
        _refused(temper("pull", "models:/tiny/1", "--dest", inside), f"error: {inside}: --dest: ",
                 f"lies in {inside.parent}, which `temper ", "choose a folder outside it")
    assert files(tmp_path) == before and not list(tmp_path.rglob(".*.partial-*"))

    pulled = tmp_path / "pulled"
    for _ in range(2):  # a new folder, then an earlier pull's: replaced whole
        done = temper("pull", "models:/tiny/1", "--dest", pulled)
        assert done.returncode == 0, done.stderr
        (pulled / "stale.txt").write_text("left from an earlier pull")
    assert temper("pull", "models:/tiny/1", "--dest", pulled).returncode == 0
    assert not (pulled / "stale.txt").exists() and (pulled / "model.onnx").is_file()


# -- 3. an export never writes into a folder another command owns ---------------------------------------------------


@pytest.mark.parametrize("where", ["model-folder-is-the-runs", "dest-is-the-run", "dest-inside-the-run",
                                   "manifests-folder-is-the-runs", "manifests-inside-the-run"])
def test_export_triton_never_writes_into_a_folder_another_command_owns(tmp_path: Path, where: str) -> None:
    """The README's defaults put a run in out/NAME: `export-triton out/NAME --dest out` wrote its version and
    config.pbtxt into the run's output folder, exit 0, and the next `temper run` deleted them without a word."""
    recipe, out = tiny_recipe(tmp_path, **GATED), tmp_path / "out"
    run = out / "tiny"  # the model's name is the recipe's: the folder it exports into is the run's own
    assert temper("run", recipe, "--output", run).returncode == 0
    flag, folder, options = {
        "model-folder-is-the-runs": ("--dest", out, ["--dest", out]),
        "dest-is-the-run": ("--dest", run, ["--dest", run]),
        "dest-inside-the-run": ("--dest", run / "repo", ["--dest", run / "repo"]),
        "manifests-folder-is-the-runs": ("--manifests", out, ["--dest", tmp_path / "repo", "--manifests", out]),
        "manifests-inside-the-run": ("--manifests", run / "k8s",
                                     ["--dest", tmp_path / "repo", "--manifests", run / "k8s"]),
    }[where]
    before = files(tmp_path)
    line = _refused(temper("export-triton", run, *options, "--kind", "KIND_CPU"), f"error: {folder}: {flag}: ",
                    "`temper run`")
    assert "choose" in line, line
    assert files(tmp_path) == before and not (tmp_path / "repo").exists()
    assert not [p for p in tmp_path.rglob(".*") if "partial" in p.name]
