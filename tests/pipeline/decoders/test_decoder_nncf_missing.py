"""A decoder recipe with an NNCF candidate on a host without NNCF: one line naming the extra to install, exit 3,
before the baseline is exported (minutes on a real model) and with no output folder written. Through the console
script, NNCF hidden behind a package that fails to import as a missing one does."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.pipeline.decoders.tiny import tiny_llama, write_recipe
from tests.pipeline.test_check_backends import TEMPER, _not_installed


def test_nncf_not_installed_is_exit_3_before_anything_is_built(tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path / "recipe.yaml", tiny_llama(tmp_path / "hf"),
                          candidates={"q8": {"weights": {"method": "matmul-nbits", "bits": 8}},
                                      "n4": {"weights": {"method": "nncf", "group_size": 32}}})
    env = {**os.environ, "PYTHONPATH": str(_not_installed(tmp_path / "hidden", "nncf"))}
    result = subprocess.run([TEMPER, "run", str(recipe), "--output", str(tmp_path / "out")], capture_output=True,
                            text=True, timeout=300, env=env)
    assert result.returncode == 3 and "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == ["error: quantize backend 'nncf' needs Intel NNCF: pip install 'temper-ml[nncf]' "
                     "(No module named 'nncf')"], result.stderr
    assert "baseline" not in result.stdout, result.stdout  # the export never started
    assert not (tmp_path / "out").exists()
