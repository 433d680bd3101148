"""The CLI contract, through the real console script in a subprocess: never lose a user's data, never
lie with an exit code. Each error is one stderr line, no traceback, with the argument or key at fault."""

from __future__ import annotations

import importlib.metadata
import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper

from temper.artifacts.formats.bundle import config_for, write

TEMPER = Path(sys.executable).with_name("temper")  # the console script installed beside this interpreter


def temper(*args: object, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    """The console script in a process of its own, as a user or a CI job runs it."""
    return subprocess.run([str(TEMPER), *map(str, args)], capture_output=True, text=True, timeout=300, cwd=cwd,
                          env={**os.environ, **env})


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    """The one line on stderr; only the progress log of finished steps (`✓ chain › step`) may precede it."""
    assert "Traceback" not in result.stderr, result.stderr
    *before, line = [line.strip() for line in result.stderr.splitlines() if line.strip()] or [""]
    assert all(b.startswith("✓ ") for b in before), result.stderr
    return line


def tiny_model(path: Path, width: int = 3) -> Path:
    """x [batch, 4] -> y [batch, width]."""
    weight = numpy_helper.from_array(np.random.default_rng(0).random((4, width), dtype=np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="matmul_0")], "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", width])], [weight],
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def tiny_recipe(folder: Path, width: int = 3, **sections: object) -> Path:
    """The tiny model, an evaluation set with labels, one fp16 candidate, and `sections`."""
    tiny_model(folder / "tiny.onnx", width)
    rng = np.random.default_rng(1)
    np.savez(folder / "eval.npz", x=rng.random((32, 4), dtype=np.float32), label=rng.integers(0, 3, 32))
    recipe = {
        "version": 1, "name": "tiny",
        "model": {"onnx": "tiny.onnx", "inputs": [{"name": "x", "shape": ["batch", 4]}], "outputs": ["y"]},
        "data": {"evaluation": {"path": "eval.npz", "label": "label", "batch_size": 8}},
        "candidates": {"fp16": {"steps": ["fp16"]}},
        **sections,
    }
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def dead_pid() -> int:
    """The id of a process that has ended (ids are not reused that fast)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


# -- 1. data loss -----------------------------------------------------------------------------------

@pytest.mark.parametrize("content", [
    {"manifest.json": '{"manifest_version": 3, "name": "my extension"}', "background.js": "chrome.runtime;"},
    {"manifest.json": '{"recipe": {"name": "tiny"}}', "baseline/model.onnx": "written by an older temper"},
], ids=["another-tools-manifest", "older-temper"])
def test_a_folder_temper_did_not_mark_is_never_replaced(tmp_path: Path, content: dict[str, str]) -> None:
    recipe = tiny_recipe(tmp_path)
    out = tmp_path / "ext"
    for name, text in content.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(text)
    before = files(out)
    result = temper("run", recipe, "--output", out)
    assert result.returncode == 2, result.stderr
    line = one_line(result)
    assert line.startswith(f"error: {out}: --output: ") and "delete it or choose another folder" in line, line
    assert files(out) == before
    assert not list(tmp_path.glob(".ext.partial-*"))


def test_temper_replaces_its_own_folder_readable_by_others_and_sweeps_dead_runs_leftovers(tmp_path: Path) -> None:
    """The output folder carries the marker and follows the umask; a second run replaces it, removes what
    a dead run left (staging beside it, scratch in the temp folder) and keeps what a live run owns."""
    recipe, out, temp = tiny_recipe(tmp_path), tmp_path / "out", tmp_path / "tmp"
    temp.mkdir()
    first = temper("run", recipe, "--output", out, TMPDIR=str(temp))
    assert first.returncode == 0, first.stderr
    marker = json.loads((out / ".temper-output").read_text())
    assert marker["tool"] == "temper" and marker["recipe"] == "tiny"
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o777 & ~umask
    assert list(temp.glob("temper-*")) == []

    dead, live = dead_pid(), os.getpid()
    leftovers = {folder / f"{prefix}{pid}-0badc0de": pid == live
                 for folder, prefix in ((tmp_path, ".out.partial-"), (temp, "temper-run-")) for pid in (dead, live)}
    for leftover in leftovers:
        leftover.mkdir()
        (leftover / "model.onnx").write_bytes(b"half written")
    second = temper("run", recipe, "--output", out, TMPDIR=str(temp))
    assert second.returncode == 0, second.stderr
    assert {leftover: leftover.exists() for leftover in leftovers} == leftovers
    assert (out / ".temper-output").is_file() and (out / "fp16" / "model.onnx").is_file()


def _bundle(tmp_path: Path, name: str) -> Path:
    model = tiny_model(tmp_path / "src" / "model.onnx")
    return write(tmp_path / "bundle", model, config_for(model, name))


@pytest.mark.parametrize("name", [".git", "a/b", "line\nbreak", ""])
def test_export_triton_refuses_a_model_name_that_is_not_a_plain_folder_name(tmp_path: Path, name: str) -> None:
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    result = temper("export-triton", _bundle(tmp_path, name), "--dest", repo)
    assert result.returncode == 2, result.stderr
    line = one_line(result)
    assert line.startswith("error: ") and "cannot be a Triton model folder name" in line, line
    assert files(repo) == {".git/HEAD": b"ref: refs/heads/main\n"}


def test_export_triton_replaces_only_a_model_folder_it_wrote(tmp_path: Path) -> None:
    bundle, repo = _bundle(tmp_path, "tiny"), tmp_path / "repo"
    (repo / "tiny").mkdir(parents=True)
    (repo / "tiny" / "notes.txt").write_text("mine")
    refused = temper("export-triton", bundle, "--dest", repo)
    assert refused.returncode == 2, refused.stderr
    line = one_line(refused)
    assert "temper did not write it" in line and "--dest" in line, line
    assert files(repo) == {"tiny/notes.txt": b"mine"}

    (repo / "tiny" / "notes.txt").unlink()
    for _ in range(2):  # an empty folder, then its own export: both replaced
        result = temper("export-triton", bundle, "--dest", repo)
        assert result.returncode == 0, result.stderr
    assert sorted(files(repo)) == ["tiny/.temper-output", "tiny/1/model.onnx", "tiny/1/runtime.json",
                                   "tiny/config.pbtxt"]


# -- 2. usage errors --------------------------------------------------------------------------------

@pytest.mark.parametrize(("args", "fragment", "hint"), [
    (["run", "--bogus"], "No such option: --bogus", "see temper run --help"),
    (["run"], "Missing argument 'recipe'", "see temper run --help"),
    (["bogus"], "No such command 'bogus'", "see temper --help"),
    (["bench", "m.onnx", "--duration", "abc"], "Invalid value for '--duration'", "see temper bench --help"),
])
def test_usage_errors_are_one_line_and_exit_2(args: list[str], fragment: str, hint: str) -> None:
    result = temper(*args)
    assert result.returncode == 2, result.stderr
    line = one_line(result)
    assert line.startswith("error: ") and fragment in line and line.endswith(f"({hint})"), line


def test_bare_temper_prints_the_help_and_version_prints_the_version() -> None:
    bare = temper()
    assert bare.returncode == 2 and "Traceback" not in bare.stderr
    assert "Usage: temper" in bare.stdout + bare.stderr and "run" in bare.stdout + bare.stderr
    version = temper("--version")
    assert version.returncode == 0, version.stderr
    assert version.stdout == f"temper {importlib.metadata.version('temper-ml')}\n"


# -- 3. interrupts ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_an_interrupted_run_says_so_and_leaves_nothing_behind(digits_dir: Path, tmp_path: Path, signum: int,
                                                              code: int) -> None:
    out, temp = tmp_path / "out", tmp_path / "tmp"
    temp.mkdir()
    run = subprocess.Popen([str(TEMPER), "run", digits_dir / "digits-cnn.yaml", "--output", out],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env={**os.environ, "TMPDIR": str(temp)},
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as a terminal would
    try:
        deadline = time.monotonic() + 120
        while not (list(temp.glob(f"temper-run-{run.pid}-*")) and list(tmp_path.glob(f".out.partial-{run.pid}-*"))):
            assert run.poll() is None and time.monotonic() < deadline, "the run ended before its folders appeared"
            time.sleep(0.05)
        time.sleep(0.5)  # into the build (the runner is made just before its try/finally)
        run.send_signal(signum)
        stdout, stderr = run.communicate(timeout=120)
    finally:
        run.kill()
    result = subprocess.CompletedProcess(run.args, run.returncode, stdout, stderr)
    assert result.returncode == code, stderr
    assert one_line(result) == "interrupted: nothing was written to the output folder"
    assert not out.exists() and list(temp.glob("temper-*")) == [] and not list(tmp_path.glob(".out.*"))


# -- 4. one line instead of a traceback ---------------------------------------------------------------

def test_a_full_disk_during_the_final_write_is_exit_3_and_leaves_nothing(tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    disk.mkdir()
    try:
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], capture_output=True,
                                 text=True)
    except OSError as exc:  # no mount command
        pytest.skip(f"cannot mount a 1 MiB tmpfs here: {exc}")
    if mounted.returncode != 0:  # not root, or a sandbox that refuses mounts
        pytest.skip(f"cannot mount a 1 MiB tmpfs here: {mounted.stderr.strip()}")
    try:
        recipe = tiny_recipe(tmp_path, width=100_000)  # a 1.6 MB baseline: more than the disk holds
        result = temper("run", recipe, "--output", disk / "out")
        assert result.returncode == 3, result.stderr
        line = one_line(result)
        assert line.startswith(f"error: {disk / 'out'}: --output: No space left on device"), line
        assert list(disk.iterdir()) == []
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=True)


def test_a_corrupt_manifest_is_bad_input_for_validate(tmp_path: Path) -> None:
    recipe = tiny_recipe(tmp_path, validate={"accuracy": {"metric": "top1", "max_drop": 0.5}})
    out = tmp_path / "out"
    out.mkdir()
    (out / "manifest.json").write_text('{"build_sha256": "trunc')
    result = temper("validate", recipe, "--output", out)
    assert result.returncode == 2, result.stderr
    line = one_line(result)
    assert line.startswith(f"error: {out}: --output: manifest.json cannot be read (JSONDecodeError"), line
    assert files(out) == {"manifest.json": b'{"build_sha256": "trunc'}


@pytest.mark.slow
def test_validate_re_gates_a_folder_whatever_the_recipe_is_named_or_publishes_to_but_not_other_steps(tmp_path):
    recipe = tiny_recipe(tmp_path, validate={"accuracy": {"metric": "top1", "max_drop": 0.5}})
    out = tmp_path / "out"
    assert temper("run", recipe, "--output", out).returncode == 0
    data = yaml.safe_load(recipe.read_text())
    data.update(name="renamed", target="avx2", publish={"mlflow": {"registered_model": "elsewhere"}})
    recipe.write_text(yaml.safe_dump(data, sort_keys=False))
    again = temper("validate", recipe, "--output", out)  # nothing that shapes a model changed
    assert again.returncode == 0, again.stderr

    data["candidates"]["fp16"]["steps"] = [{"fp16": {"keep_io_types": False}}]  # a step's option shapes its model
    recipe.write_text(yaml.safe_dump(data, sort_keys=False))
    refused = temper("validate", recipe, "--output", out)
    assert refused.returncode == 2, refused.stderr
    assert one_line(refused) == (f"error: {recipe}: the models in {out} were built from a different model, data or "
                                 "steps than this recipe now has: run `temper run` to rebuild them")


# -- 5. start-up ------------------------------------------------------------------------------------

def test_the_cli_and_the_serving_runtime_do_not_import_torch() -> None:
    code = "import temper.pipeline.cli, temper.artifacts.serving.runtime, sys; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


# -- 6. noise and labels ----------------------------------------------------------------------------

@pytest.mark.slow
def test_publishing_prints_no_library_logs_or_warnings(tmp_path: Path) -> None:
    recipe = tiny_recipe(tmp_path, validate={"accuracy": {"metric": "top1", "max_drop": 0.5}},
                         publish={"mlflow": {"registered_model": "tiny", "alias": "candidate"}})
    result = temper("run", recipe, "--output", tmp_path / "out", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "published: models:/tiny@candidate" in result.stdout
    assert [line for line in result.stderr.splitlines() if line.strip() and "✓" not in line] == []


@pytest.mark.slow
def test_each_shared_step_is_reported_once(tmp_path: Path) -> None:
    """The pre-flight needs the baseline before the build does: it is built (or read from the cache) once,
    so `baseline › simplify` is one line, not one for the pre-flight and one for the build."""
    recipe = tiny_recipe(tmp_path, steps=["simplify"], validate={"accuracy": {"metric": "top1", "max_drop": 0.5}})
    for attempt in ("built", "cached"):
        result = temper("run", recipe, "--output", tmp_path / attempt)
        assert result.returncode == 0, result.stderr
        shared = [line.strip() for line in result.stderr.splitlines() if "baseline › simplify" in line]
        assert len(shared) == 1 and shared[0].endswith("cached") == (attempt == "cached"), result.stderr


@pytest.mark.slow
def test_promote_names_the_argument_that_is_wrong(tracking_store: str) -> None:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_store, tracking_store)
    client.create_registered_model("tiny")
    client.create_model_version("tiny", source="file:///nowhere/model")
    for model, version, alias, key in [("nobody", "1", "champion", "NAME"), ("tiny", "7", "champion", "VERSION"),
                                       ("tiny", "1", "bad!alias", "--alias")]:
        result = temper("promote", model, version, "--alias", alias)
        assert result.returncode == 2, result.stderr
        line = one_line(result)
        assert line.startswith(f"error: models:/{model}/{version}: {key}: "), line
    assert client.get_registered_model("tiny").aliases == {}


def test_promote_tells_a_store_that_does_not_answer_from_a_wrong_name(tmp_path: Path) -> None:
    absent = temper("promote", "tiny", "1", "--alias", "champion", "--tracking-uri", "http://127.0.0.1:1", cwd=tmp_path)
    assert absent.returncode == 3, absent.stderr
    assert one_line(absent).startswith("error: the MLflow store http://127.0.0.1:1 does not answer"), absent.stderr


@pytest.mark.slow
@pytest.mark.parametrize("command", [["pull", "--dest", "bundle"], ["serve", "--port", "0"],
                                     ["export-triton", "--dest", "repo"]])
def test_registry_commands_tell_an_unknown_model_from_a_store_that_does_not_answer(command, tmp_path):
    """One resolver for every command: no such name/alias is bad input (2), an absent store the environment (3)."""
    name, *options = command
    unknown = temper(name, "models:/nobody@champion", *options, "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}",
                     cwd=tmp_path)
    assert unknown.returncode == 2, unknown.stderr
    assert one_line(unknown).startswith("error: models:/nobody@champion: MODEL" if name != "pull" else
                                        "error: models:/nobody@champion: URI")
    absent = temper(name, "models:/nobody@champion", *options, "--tracking-uri", "http://127.0.0.1:1", cwd=tmp_path)
    assert absent.returncode == 3, absent.stderr
    assert "MLflow store http://127.0.0.1:1 does not answer" in one_line(absent)
    assert not (tmp_path / "bundle").exists() and not (tmp_path / "repo").exists()
