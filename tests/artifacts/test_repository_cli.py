"""`temper serve REPOSITORY` and `temper export-triton --version` from the command line: the model control flags
checked as Triton checks them (exit 2, one line naming the flag), a repository served in a new process, and
the version a pulled bundle answers with."""

from __future__ import annotations

import json
from pathlib import Path

import onnxruntime as ort
import pytest

from temper.artifacts.core.folders import mark
from tests.artifacts.repositories import OTHER, references
from tests.artifacts.servers import MODEL, Client, _bundle, _free_port, _temper_serve, _tiny_model
from tests.artifacts.test_server_cli import _infer_checked


@pytest.mark.parametrize(("args", "flag", "says"), [
    (["--model-control-mode", "poll"], "--model-control-mode", "must be one of none, explicit, got 'poll'"),
    (["--load-model", MODEL], "--load-model", "needs --model-control-mode explicit"),
    (["--model-control-mode", "explicit", "--load-model", "nothing"], "--load-model",
     "'nothing' is not a model of the repository (it has: other, tiny)"),
    (["--model-control-mode", "explicit", "--load-model", "*", "--load-model", MODEL], "--load-model", "give it alone"),
])
def test_bad_model_control_flags_are_one_line_exit_2(temper, repo: Path, args: list[str], flag: str,
                                                     says: str) -> None:
    result = temper("serve", repo, "--port", _free_port(), *args)
    (line,) = result.stderr.strip().splitlines()
    assert result.code == 2 and "serving" not in result.stdout, result
    assert f": {flag}: " in line and says in line, line


def test_a_repository_version_without_a_bundle_is_named_at_start(temper, tmp_path: Path) -> None:
    (tmp_path / "repo" / "old" / "1").mkdir(parents=True)  # what export-triton wrote before versions were bundles
    (tmp_path / "repo" / "old" / "1" / "model.onnx").write_bytes(b"")
    result = temper("serve", tmp_path / "repo", "--port", _free_port())
    (line,) = result.stderr.strip().splitlines()
    assert result.code == 2 and str(tmp_path / "repo" / "old") in line and "export it again" in line, line


def test_serve_a_repository_in_explicit_mode(repo: Path) -> None:
    refs: dict[str, ort.InferenceSession] = references(repo)
    args = ("--model-control-mode", "explicit", "--load-model", OTHER)
    with _temper_serve(str(repo), args=args) as (port, output):
        _infer_checked(port, refs[OTHER], model=OTHER)
        c = Client(port)
        assert c.call("POST", f"/v2/models/{MODEL}/infer", b"{}")[0] == 404
        assert c.call("POST", f"/v2/repository/models/{MODEL}/load", b"")[0] == 200
        c.close()
        _infer_checked(port, refs[MODEL], model=MODEL)
    assert "2 model(s): other, tiny" in output["stdout"], output["stdout"]


def test_a_pulled_bundle_serves_and_exports_as_its_registry_version(temper, tmp_path: Path) -> None:
    """`temper pull` records models:/NAME/VERSION in the bundle's marker: that version is what serves and exports."""
    folder = _bundle(tmp_path / "pulled", _tiny_model(tmp_path / "tiny.onnx"), MODEL)
    mark(folder, pulled=f"models:/{MODEL}/4")
    with _temper_serve(str(folder)) as (port, output):
        c = Client(port)
        assert json.loads(c.call("GET", f"/v2/models/{MODEL}")[2])["versions"] == ["4"]
        assert c.call("GET", f"/v2/models/{MODEL}/versions/4/ready")[0] == 200
        assert c.call("GET", f"/v2/models/{MODEL}/versions/1/ready")[0] == 404
        c.close()
    assert "version 4" in output["stdout"]
    result = temper("export-triton", folder, "--dest", tmp_path / "repo")
    assert result.code == 0, result
    assert (tmp_path / "repo" / MODEL / "4" / "runtime.json").is_file()
    result = temper("export-triton", folder, "--dest", tmp_path / "repo", "--version", "7")
    assert result.code == 0, result
    assert sorted(p.name for p in (tmp_path / "repo" / MODEL).iterdir() if p.is_dir()) == ["4", "7"]
    result = temper("export-triton", folder, "--dest", tmp_path / "repo", "--version", "0")
    assert result.code == 2 and "--version" in result.stderr
