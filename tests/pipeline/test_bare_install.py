"""A bare `pip install temper-ml` (no `cpu` or `gpu` extra) has no ONNX Runtime: the installed console script,
run in a real interpreter where `import onnxruntime` fails, answers every command, --help included, with one
line naming the extras and exit 3, never a traceback; `temper --version` still answers.

ONNX Runtime is made unimportable by a sitecustomize first on PYTHONPATH that installs a meta-path finder
refusing `onnxruntime` (the interpreter's own import machinery, as a site without the package has it); a
second variant refuses it with the ImportError a GPU build gives when its CUDA libraries do not load.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TEMPER = Path(sys.executable).with_name("temper")
REFUSE = '''
import sys


class Refuse:
    """`import onnxruntime` fails here as it does {where}."""

    def find_spec(self, name, path=None, target=None):
        if name == "onnxruntime" or name.startswith("onnxruntime."):
            raise {error}
        return None


sys.meta_path.insert(0, Refuse())
'''
MISSING = "ModuleNotFoundError(f\"No module named '{name}'\", name=name)"
BROKEN = "ImportError('libcudnn.so.9: cannot open shared object file: No such file or directory')"


def _environment(site: Path, error: str, where: str) -> dict[str, str]:
    site.mkdir()
    (site / "sitecustomize.py").write_text(REFUSE.format(error=error, where=where))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    return env


def _temper(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(TEMPER), *args], capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.parametrize("args", [["--help"], [], ["check", "recipe.yaml"], ["run", "recipe.yaml"],
                                  ["serve", "bundle"], ["bench", "model.onnx"], ["export-triton", "m", "--dest", "r"]])
def test_every_command_without_onnxruntime_is_one_line_naming_the_extras_and_exit_3(tmp_path: Path,
                                                                                      args: list[str]) -> None:
    done = _temper(_environment(tmp_path / "site", MISSING, "without the package"), *args)
    assert done.returncode == 3, done.stdout + done.stderr
    assert done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        "error: no ONNX Runtime is installed: pip install 'temper-ml[cpu]', or 'temper-ml[gpu]' on an NVIDIA GPU host"]


def test_an_onnxruntime_that_does_not_load_is_one_line_naming_the_reinstall(tmp_path: Path) -> None:
    done = _temper(_environment(tmp_path / "site", BROKEN, "when a GPU build's CUDA libraries do not load"),
                   "check", "recipe.yaml")
    assert done.returncode == 3, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr
    assert lines[0].startswith("error: onnxruntime does not import (ImportError: libcudnn.so.9: cannot open shared "
                               "object file")
    assert "pip uninstall -y onnxruntime onnxruntime-gpu" in lines[0] and "temper-ml[gpu]" in lines[0]


def test_the_version_answers_without_onnxruntime(tmp_path: Path) -> None:
    done = _temper(_environment(tmp_path / "site", MISSING, "without the package"), "--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("temper ") and done.stderr == ""


def test_with_onnxruntime_the_help_still_lists_the_commands(tmp_path: Path) -> None:
    done = _temper(dict(os.environ), "--help")
    assert done.returncode == 0, done.stderr
    assert "run" in done.stdout and "serve" in done.stdout
