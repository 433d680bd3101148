"""gRPC's answer for a request whose worker died: UNAVAILABLE, as Triton answers an unavailable instance."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from temper.artifacts.formats import bundle
from temper.artifacts.serving.runtime import Runtime
from tests.artifacts import grpc_servers
from tests.artifacts.grpc_servers import GrpcServed, _infer
from tests.artifacts.servers import _expected, _inputs

tiny = grpc_servers.tiny


@pytest.fixture
def served(tiny: Path) -> Iterator[GrpcServed]:
    with GrpcServed(Runtime(tiny, instances=1)) as s:
        yield s


def test_a_request_whose_worker_died_is_unavailable(served: GrpcServed, tiny: Path) -> None:
    pool = served.runtime.pool
    assert pool is not None
    instance = pool.instances[0]
    pid = instance.pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)  # the batch waits in the worker until it is killed
    errors: list[Exception] = []
    c = served.client()

    def call() -> None:
        try:
            _infer(c, _inputs(5, rows=1))
        except Exception as exc:  # noqa: BLE001 - the error is what is checked
            errors.append(exc)

    thread = threading.Thread(target=call)
    thread.start()
    deadline = time.monotonic() + 30
    while pool.idle_count:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    thread.join(30)
    (error,) = errors
    assert isinstance(error, Exception) and error.status() == "StatusCode.UNAVAILABLE"  # type: ignore[attr-defined]
    assert "died running this request's batch" in error.message()  # type: ignore[attr-defined]
    deadline = time.monotonic() + 60
    while not instance.ready:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    inputs = _inputs(6, rows=2)
    reference = ort.InferenceSession(str(tiny / bundle.MODEL), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(_infer(c, inputs).as_numpy("y"), _expected(reference, inputs)["y"], rtol=1e-6)
    c.close()
