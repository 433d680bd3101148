"""The model repository tests' harness: two tiny real models exported with `export_repository` into one
repository (tiny in versions 1 and 2, other in version 1), ONNX Runtime on each served version directly,
and a Models over it built with a gate a test can hold a load at."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import onnxruntime as ort

from temper.artifacts.formats.repository import ModelRepository, Source
from temper.artifacts.serving.models import Models, runtime_of
from temper.artifacts.serving.runtime import Runtime
from temper.artifacts.triton.config import export_repository
from tests.artifacts.servers import MODEL, _bundle, _tiny_model

OTHER = "other"


def make_repository(root: Path) -> Path:
    """root/repo with tiny/1 (seed 0), tiny/2 (seed 5: what is served) and other/1 (seed 3)."""
    repo = root / "repo"
    for name, seed, version in ((MODEL, 0, "1"), (MODEL, 5, "2"), (OTHER, 3, "1")):
        model = _tiny_model(root / f"{name}-{seed}.onnx", seed=seed)
        bundle = _bundle(root / f"bundle-{name}-{seed}", model, name, max_batch_size=8, max_delay_ms=2)
        export_repository(bundle, repo, version=version)
    return repo


def references(repo: Path) -> dict[str, ort.InferenceSession]:
    """ONNX Runtime on the version each model serves (the highest)."""
    return {MODEL: _session(repo / MODEL / "2" / "model.onnx"), OTHER: _session(repo / OTHER / "1" / "model.onnx")}


def _session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


class Gate:
    """Holds every load until opened: a real Runtime is built, only later, so a test sees a load in flight."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.waiting = threading.Event()

    def build(self, source: Source, instances: int | None) -> Runtime:
        self.waiting.set()
        assert self.open.wait(60), "the test never opened the gate"
        return runtime_of(source, instances)


def models(repo: Path, mode: str = "none", startup: list[str] | None = None, strict: bool = True,
           gate: Gate | None = None, instances: int | None = 0) -> Models:
    return Models(ModelRepository(repo), mode, startup, strict, instances, build=gate.build if gate else runtime_of)


def outputs(reply: dict) -> dict[str, np.ndarray]:
    return {o["name"]: np.asarray(o["data"]).reshape(o["shape"]) for o in reply["outputs"]}
