"""Ctrl-C during the torch export, through the console script: exit 130 and the interrupt's line, never
"export failed ... try model.export.dynamo: false" (exit 1). torch's exporter interrupted during one of its
lazy imports fails on its way out with an AttributeError of its own (the half-imported module), which it
wraps in a TorchExportError: 1 of 9 cold exports interrupted at 0.3-4.3 s did so here. The factory below
makes that deterministic: its forward, while torch.export traces it, sends the process SIGINT, and a
cleanup then fails the way the half-imported module does."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import numpy as np
import yaml

from tests.pipeline.test_cli_contract import TEMPER, one_line

FACTORY = '''
import os
import signal
import time

import torch


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, x):
        if torch.compiler.is_exporting():
            try:
                os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C, while torch traces the model
                time.sleep(30)
            finally:
                torch.onnx._not_imported_yet  # the library's way out fails: AttributeError
        return self.linear(x)


def build():
    return Tiny()
'''


def _recipe(folder: Path) -> Path:
    (folder / "tiny_model.py").write_text(FACTORY)
    rng = np.random.default_rng(0)
    np.savez(folder / "eval.npz", x=rng.standard_normal((16, 4)).astype(np.float32))
    recipe = folder / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({
        "version": 1, "name": "tiny",
        "model": {"factory": "tiny_model.py:build", "inputs": [{"name": "x", "shape": ["batch", 4]}],
                  "outputs": ["y"]},
        "data": {"evaluation": {"path": "eval.npz", "batch_size": 4}},
        "candidates": {"fp16": {"steps": ["fp16"]}},
    }, sort_keys=False))
    return recipe


def _temper(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(TEMPER), *map(str, args)], capture_output=True, text=True, timeout=120,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as a terminal would


def test_ctrl_c_during_the_export_is_an_interrupt_not_a_failed_export(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path)
    checked = _temper("check", recipe)
    assert checked.returncode == 130, checked.stderr[-3000:]
    assert one_line(checked) == "interrupted"
    out = tmp_path / "out"
    ran = _temper("run", recipe, "--output", out)
    assert ran.returncode == 130, ran.stderr[-3000:]
    assert one_line(ran) == "interrupted: nothing was written to the output folder"
    assert not out.exists() and not [p for p in os.listdir(tmp_path) if p.startswith(".out")]
