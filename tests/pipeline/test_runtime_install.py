"""Exactly one ONNX Runtime: the installed console script, run with a second distribution beside the first (its
dist-info first on PYTHONPATH, found by the real importlib.metadata), refuses every command that opens a session
in one line, exit 3, naming the fix; commands that open none, and --help, still answer."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from temper.artifacts.core import versions
from temper.pipeline.cli import app
from temper.pipeline.cli.common import SESSIONLESS
from tests.artifacts.fake_site import distribution, environment

TEMPER = Path(sys.executable).with_name("temper")
GPU_VERSION = "1.31.1"


@pytest.fixture
def both(tmp_path: Path) -> dict[str, str]:
    """This environment (one ONNX Runtime) plus an onnxruntime-gpu distribution: what `pip install temper-ml[gpu]`
    left before the runtime was an extra, or a GPU install on top of a CPU one."""
    installed = versions.runtimes()
    if "onnxruntime-gpu" in installed:
        pytest.skip("onnxruntime-gpu is installed here: this test adds it to a CPU install")
    site = tmp_path / "site"
    distribution(site, "onnxruntime-gpu", GPU_VERSION)
    return environment(site)


def _temper(env: dict[str, str], *args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(TEMPER), *map(str, args)], capture_output=True, text=True, env=env, timeout=300)


def test_both_runtimes_installed_is_exit_3_in_one_line_naming_the_fix(both: dict[str, str], tmp_path: Path) -> None:
    cpu = versions.runtimes()["onnxruntime"]
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("name: x\n")
    for args in (("check", recipe), ("run", recipe, "--output", tmp_path / "out"), ("bench", tmp_path / "m.onnx"),
                 ("serve", tmp_path / "bundle", "--port", "0")):
        done = _temper(both, *args)
        assert done.returncode == 3, (args, done.stdout, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: two ONNX Runtimes are installed"), done.stderr
        assert f"onnxruntime {cpu} and onnxruntime-gpu {GPU_VERSION}" in lines[0], lines[0]
        assert "pip uninstall -y onnxruntime onnxruntime-gpu, then pip install 'temper-ml[gpu]'" in lines[0], lines[0]
    assert not (tmp_path / "out").exists()


def test_help_and_sessionless_commands_still_answer_with_both(both: dict[str, str]) -> None:
    for args in (("--help",), ("run", "--help"), ("schema",)):
        done = _temper(both, *args)
        assert done.returncode == 0, (args, done.stderr)
    done = _temper(both, "bench")  # a missing argument stays the usage error it is
    assert done.returncode == 2, done.stderr


def test_every_command_but_the_sessionless_checks_the_runtime_first() -> None:
    names = {command.name or command.callback.__name__.replace("_", "-"): command.callback
             for command in app.registered_commands if command.callback is not None}
    assert set(SESSIONLESS) <= set(names)
    checked = {name for name, callback in names.items() if getattr(callback, "opens_sessions", False)}
    assert checked == set(names) - set(SESSIONLESS), checked


def test_this_environment_has_exactly_one_runtime() -> None:
    assert len(versions.runtimes()) == 1, versions.runtimes()
    versions.require_one_runtime()


def test_a_bundle_gated_on_the_gpu_build_says_so_where_the_cpu_build_serves_it() -> None:
    now = {"onnxruntime": "1.32.0", "onnx": "1.23.2"}
    gated = {"onnxruntime": "1.31.1", "onnxruntime-gpu": "1.31.1", "onnx": "1.23.2"}
    assert versions.drift(gated, now) == ["onnxruntime 1.32.0 (gated on 1.31.1)", "onnxruntime-gpu absent (gated on "
                                                                                   "1.31.1)"]
    assert versions.drift({"onnxruntime": "1.32.0"}, {"onnxruntime": "1.32.0", "onnxruntime-gpu": "1.32.0"}) == []
