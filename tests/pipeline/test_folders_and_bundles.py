"""Folders temper writes into and bundles it serves, when they are not what they should be, through the
console script: a full disk, a read-only folder, a file where a folder goes, a weights file cut short, a
runtime.json of another model, another tool's manifest. Each is exit 2 (3 for a full disk) and one stderr
line naming the file or flag, with nothing half-written; `temper validate` rewrites a folder as atomically
as `temper run` writes one."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import onnx
import pytest

from temper.artifacts.formats.bundle import config_for, write
from tests.pipeline.test_cli_contract import files, one_line, temper, tiny_model, tiny_recipe

GATED = {"validate": {"accuracy": {"metric": "top1", "max_drop": 0.5}}}


def _mount(*args: str) -> str | None:
    """Run mount(8); why it failed (not root, a sandbox that refuses mounts, no mount command), or None."""
    try:
        done = subprocess.run(["mount", *args], capture_output=True, text=True)
    except OSError as exc:
        return str(exc)
    return done.stderr.strip() or f"exit {done.returncode}" if done.returncode else None


@contextmanager
def tmpfs(folder: Path, size: str) -> Iterator[Path]:
    """`folder` as a real file system of `size` (a tmpfs), for a disk that really fills up; skips without mounts."""
    folder.mkdir()
    if (why := _mount("-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder))) is not None:
        pytest.skip(f"cannot mount a {size} tmpfs here: {why}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=True)


@contextmanager
def read_only(folder: Path) -> Iterator[Path]:
    """`folder` made read-only: chmod for a user; for root, whom chmod does not stop, a read-only bind mount of
    it (skips when this host refuses mounts)."""
    if os.geteuid() != 0:
        mode = folder.stat().st_mode
        folder.chmod(0o555)
        try:
            yield folder
        finally:
            folder.chmod(mode)
        return
    if (why := _mount("--bind", str(folder), str(folder))) is not None:
        pytest.skip(f"running as root, whom chmod does not stop, and a read-only bind mount is refused: {why}")
    try:
        if (why := _mount("-o", "remount,ro,bind", str(folder))) is not None:
            pytest.skip(f"running as root, whom chmod does not stop, and a bind mount cannot be made read-only: {why}")
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def _fill(disk: Path) -> None:
    """Write a file on `disk` until the file system says it is full."""
    with open(disk / "filler", "wb") as filler:
        try:
            while True:
                filler.write(b"\0" * 65536)
                filler.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc


def _refused(result: subprocess.CompletedProcess[str], start: str, *fragments: str, code: int = 2) -> str:
    assert result.returncode == code, result.stderr
    line = one_line(result)
    assert line.startswith(start) and all(f in line for f in fragments), line
    return line


# --- temper validate rewrites a folder whole


def test_validate_on_a_full_disk_leaves_the_folder_byte_for_byte_as_it_was(tmp_path: Path) -> None:
    """A real full disk: the output folder on a 1 MiB tmpfs, filled to the last block after `temper run`.
    Writing report.json in place truncated it first; the rewrite is staged and swapped in, like a run's."""
    recipe = tiny_recipe(tmp_path, **GATED)
    with tmpfs(tmp_path / "disk", "1m") as disk:
        out = disk / "out"
        assert temper("run", recipe, "--output", out).returncode == 0
        before = files(out)
        _fill(disk)
        _refused(temper("validate", recipe, "--output", out), f"error: {out}: --output: No space left on device",
                 "nothing was replaced", code=3)
        assert files(out) == before
        assert sorted(p.name for p in disk.iterdir()) == ["filler", "out"]  # no staging folder left behind


def test_validate_replaces_the_reports_and_links_the_models(tmp_path: Path) -> None:
    """The new folder holds the models as hard links (nothing copied), the files a user put there, and only
    the reports this validation wrote: a plot of an earlier one's throughput no longer sits beside them."""
    recipe = tiny_recipe(tmp_path, **GATED)
    out = tmp_path / "out"
    assert temper("run", recipe, "--output", out).returncode == 0
    (out / "throughput.png").write_bytes(b"a plot of budgets gone by")
    (out / "notes.txt").write_text("mine")
    model = (out / "fp16" / "model.onnx").stat().st_ino
    result = temper("validate", recipe, "--output", out)
    assert result.returncode == 0, result.stderr
    assert not (out / "throughput.png").exists() and (out / "notes.txt").read_text() == "mine"
    assert (out / "fp16" / "model.onnx").stat().st_ino == model and (out / "report.json").is_file()
    assert not list(tmp_path.glob(".out.*"))


def test_validate_on_a_read_only_folder(tmp_path: Path) -> None:
    recipe = tiny_recipe(tmp_path, **GATED)
    out = tmp_path / "out"
    assert temper("run", recipe, "--output", out).returncode == 0
    before = files(out)
    with read_only(out):
        _refused(temper("validate", recipe, "--output", out), f"error: {out}: --output: could not be written (")
    assert files(out) == before and not list(tmp_path.glob(".out.*"))


def _external_recipe(folder: Path) -> Path:
    """The tiny recipe on a model whose weights live in tiny.onnx.data beside it."""
    recipe = tiny_recipe(folder, **GATED)
    model = onnx.load(str(folder / "tiny.onnx"))
    onnx.save(model, str(folder / "tiny.onnx"), save_as_external_data=True, location="tiny.onnx.data",
              size_threshold=0)
    return recipe


@pytest.mark.parametrize("damage", ["cut short", "missing"])
def test_validate_when_a_weights_file_is_cut_short_or_missing(tmp_path: Path, damage: str) -> None:
    """The manifest's sha256 covers model.onnx; its external data used to reach ONNX Runtime as a traceback."""
    recipe = _external_recipe(tmp_path)
    out = tmp_path / "out"
    assert temper("run", recipe, "--output", out).returncode == 0
    data = out / "baseline" / "tiny.onnx.data"
    if damage == "missing":
        data.unlink()
    else:
        data.write_bytes(data.read_bytes()[:10])
    _refused(temper("validate", recipe, "--output", out), f"error: {data}: is ", damage,
             "rebuild the folder with `temper run`")


# --- folders named by flags: pull --dest, the step cache


@pytest.mark.slow
def test_pull_into_a_file_under_a_file_or_a_read_only_folder(tmp_path: Path) -> None:
    recipe = tiny_recipe(tmp_path, **GATED, publish={"mlflow": {"registered_model": "tiny"}})
    assert temper("run", recipe, "--output", tmp_path / "out").returncode == 0
    (tmp_path / "a-file").write_text("mine")
    locked = tmp_path / "locked"
    locked.mkdir()
    for dest, fragment in [(tmp_path / "a-file", "is a file, not a folder"),
                           (tmp_path / "a-file" / "bundle", f"{tmp_path / 'a-file'} is a file, not a folder")]:
        _refused(temper("pull", "models:/tiny/1", "--dest", dest), f"error: {dest}: --dest: ", fragment)
    with read_only(locked):
        _refused(temper("pull", "models:/tiny/1", "--dest", locked / "bundle"),
                 f"error: {locked / 'bundle'}: --dest: could not be written (")
    assert (tmp_path / "a-file").read_text() == "mine" and list(locked.iterdir()) == []


@pytest.mark.parametrize("case", ["file", "under-a-file", "read-only", "env-file"])
def test_a_cache_folder_that_is_a_file_or_read_only(tmp_path: Path, case: str) -> None:
    recipe, out = tiny_recipe(tmp_path), tmp_path / "out"
    (tmp_path / "a-file").write_text("mine")
    cache = {"file": tmp_path / "a-file", "under-a-file": tmp_path / "a-file" / "cache",
             "env-file": tmp_path / "a-file", "read-only": tmp_path / "cache"}[case]
    if case == "env-file":
        result = temper("run", recipe, "--output", out, TEMPER_CACHE_DIR=str(cache))
        _refused(result, f"error: {cache}: TEMPER_CACHE_DIR: ", "is a file, not a folder")
    elif case == "read-only":
        cache.mkdir()
        with read_only(cache):
            _refused(temper("run", recipe, "--output", out, "--cache-dir", cache),
                     f"error: {cache}: --cache-dir: could not be written (")
    else:
        _refused(temper("run", recipe, "--output", out, "--cache-dir", cache), f"error: {cache}: --cache-dir: ",
                 f"{tmp_path / 'a-file'} is a file, not a folder")
    assert not out.exists() and (tmp_path / "a-file").read_text() == "mine"


# --- what temper serve is handed


@pytest.mark.parametrize(("edit", "fragment"), [
    (lambda c: c["inputs"][0].update(name="z"), "declares inputs ['z'] but model.onnx takes ['x']"),
    (lambda c: c["inputs"][0].update(dtype="int64"), "declares input 'x' as int64 but model.onnx has float32"),
    (lambda c: c["outputs"][0].update(shape=[-1, 5]), "declares output 'y' with shape [-1, 5] but model.onnx has"),
], ids=["input-name", "dtype", "shape"])
def test_serve_a_bundle_whose_runtime_json_is_another_models(tmp_path: Path, edit, fragment: str) -> None:
    """Bad input (2), found at load: it used to start, fail its warm-up and exit 3 as if the host were at fault."""
    model = tiny_model(tmp_path / "src" / "model.onnx")
    bundle = write(tmp_path / "bundle", model, config_for(model, "tiny"))
    config = json.loads((bundle / "runtime.json").read_text())
    edit(config)
    (bundle / "runtime.json").write_text(json.dumps(config))
    result = temper("serve", bundle, "--port", "0")
    _refused(result, f"error: {bundle}: MODEL: cannot load the bundle: ", fragment, "pull it again")
    assert "serving" not in result.stdout


def test_serve_a_folder_with_another_tools_manifest(tmp_path: Path) -> None:
    """A manifest.json with a candidates mapping but no recipe was read as temper's: KeyError: 'recipe'."""
    folder = tmp_path / "theirs"
    model = tiny_model(folder / "baseline" / "model.onnx")
    digest = hashlib.sha256(model.read_bytes()).hexdigest()
    (folder / "manifest.json").write_text(json.dumps({"baseline": {"model": "m"}, "candidates": {},
                                                      "models": [{"id": "m", "sha256": digest}]}))
    line = _refused(temper("serve", folder / "baseline", "--port", "0"),
                    f"error: {folder / 'manifest.json'}: is not a temper manifest (no recipe.resolved mapping)")
    assert "KeyError" not in line
