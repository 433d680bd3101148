"""Fixtures the artifacts tests share: the tiny model's serving bundle, ONNX Runtime on it directly,
a real HTTP server (one per test module) with a keep-alive client, and runtimes always stopped."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import onnxruntime as ort
import pytest

from temper.artifacts.formats import bundle
from temper.artifacts.serving.runtime import Runtime
from tests.artifacts.repositories import make_repository, references
from tests.artifacts.servers import MODEL, Client, Served, _bundle, _tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tiny")
    return _bundle(root / "bundle", _tiny_model(root / "tiny.onnx"), MODEL, max_batch_size=8, max_delay_ms=2)


@pytest.fixture(scope="module")
def reference(tiny: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(tiny / bundle.MODEL), providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model repository of two bundles as `temper export-triton` writes it (tests/artifacts/repositories.py)."""
    return make_repository(tmp_path_factory.mktemp("repository"))


@pytest.fixture(scope="module")
def refs(repo: Path) -> dict[str, ort.InferenceSession]:
    return references(repo)


@pytest.fixture(scope="module")
def server(tiny: Path) -> Iterator[Served]:
    with Served(Runtime(tiny)) as served:
        yield served


@pytest.fixture
def client(server: Served) -> Iterator[Client]:
    c = Client(server.port)
    yield c
    c.close()


@pytest.fixture
def started(request: pytest.FixtureRequest):
    """Start runtimes for a test and always stop them, so no batching thread outlives it."""
    runtimes: list[Runtime] = []

    def start(runtime: Runtime) -> Runtime:
        runtimes.append(runtime)
        runtime.start()
        return runtime

    yield start
    for runtime in runtimes:
        runtime.stop()
