"""`temper serve` over real HTTP with a model slow enough for the queue to fill: overload is 503,
a request not answered in time 504, requests queued when the runtime stops 503."""

from __future__ import annotations

import gzip
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from temper.artifacts.serving.runtime import Runtime
from tests.artifacts.servers import Client, Served, _bundle, _counter, _families, _metrics, _slow_model

# -- overload and timeout: a model slow enough for the queue to fill ------------------------------


@pytest.fixture(scope="module")
def slow_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _slow_model(tmp_path_factory.mktemp("slow") / "slow.onnx")


def _slow_request(seed: int, rows: int = 1) -> dict:
    return {"inputs": [{"name": "x", "shape": [rows, 4], "datatype": "FP32",
                        "data": np.random.default_rng(seed).random(rows * 4).tolist()}]}


def test_overload_is_503_and_the_server_recovers(slow_model: Path, tmp_path: Path) -> None:
    folder = _bundle(tmp_path / "bundle", slow_model, "slow", max_batch_size=1, max_queue=1)
    with Served(Runtime(folder)) as served:
        start = threading.Barrier(16)

        def one(seed: int) -> tuple[int, bytes]:
            c = Client(served.port)
            start.wait()
            status, _, body = c.infer(_slow_request(seed), model="slow")
            c.close()
            return status, body

        with ThreadPoolExecutor(16) as pool:
            results = list(pool.map(one, range(16)))
        statuses = sorted(s for s, _ in results)
        assert set(statuses) <= {200, 503} and 200 in statuses and 503 in statuses, statuses
        assert all("queue full" in json.loads(b)["error"] for s, b in results if s == 503)
        c = Client(served.port)
        assert c.infer(_slow_request(99), model="slow")[0] == 200
        assert c.call("GET", "/v2/health/ready")[0] == 200
        metrics = _metrics(c)
        (info,) = _families(c)["temper_runtime_info"].samples
        c.close()
    assert _counter(metrics, "nv_inference_request_failure", reason="REJECTED") >= 1  # the queue turned them away
    assert _counter(metrics, "nv_inference_request_failure", reason="BACKEND") == 0
    assert _counter(metrics, "temper_inline_exec_count") == 0  # milliseconds per run: never on the event loop
    assert info.labels["model"] == "slow" and info.labels["inline"] == "false"


def test_request_not_answered_in_time_is_504(tmp_path: Path) -> None:
    """The server stops waiting for a request being computed: 504 "not answered within", and the run it
    left counts a failure. Premise: the batcher takes the request well inside the 100 ms timeout and one
    row then computes for longer (0.52 s on a quiet AVX-512 EPYC). A 1 ms timeout made it a race that the
    queue sometimes lost first on a loaded 2-core host (504 "Request timeout expired", never computed:
    tests/artifacts/test_request_params.py tests that answer). One row in a bundle of max_batch_size 1, so
    the server warms up one run, not every batch size."""
    model = _slow_model(tmp_path / "slower.onnx", inner=2048)
    folder = _bundle(tmp_path / "bundle", model, "slow", timeout_s=0.1, max_batch_size=1)
    with Served(Runtime(folder)) as served:
        c = Client(served.port)
        status, _, body = c.infer(_slow_request(0), model="slow")
        assert status == 504 and "not answered within" in json.loads(body)["error"], (status, body)
        assert c.call("GET", "/v2/health/live")[0] == 200
        c.close()
        counters, deadline = served.app.runtime.metrics, time.monotonic() + 30
        while sum(counters.snapshot()[k] for k in ("request_success", "request_failure")) < 1:
            assert time.monotonic() < deadline
            time.sleep(0.01)  # the run the client stopped waiting for finishes
    metrics = counters.snapshot()  # the client got a 504: a failure, not a success, whether it ran or not
    assert (metrics["request_success"], metrics["request_failure"]) == (0, 1), metrics


def test_requests_queued_when_the_runtime_stops_are_503_and_the_server_answers_on(slow_model: Path,
                                                                                  tmp_path: Path) -> None:
    """The runtime stopped under queued requests (the lifespan stops it on shutdown): they answer 503
    saying so at once, never 500, nor 504 after timeout_s; the server itself keeps answering."""
    folder = _bundle(tmp_path / "bundle", slow_model, "slow", max_batch_size=16)
    runtime = Runtime(folder)
    with Served(runtime) as served:

        def one(seed: int) -> tuple[int, bytes]:
            c = Client(served.port)
            status, _, body = c.infer(_slow_request(seed, rows=16), model="slow")  # one ~100 ms batch each
            c.close()
            return status, body

        with ThreadPoolExecutor(6) as pool:
            calls = [pool.submit(one, seed) for seed in range(6)]
            deadline = time.monotonic() + 30
            while runtime.pending < 2:
                assert time.monotonic() < deadline, "the requests never queued"
                time.sleep(0.001)
            runtime.stop()
            results = [call.result(timeout=30) for call in calls]
        statuses = sorted(status for status, _ in results)
        assert set(statuses) <= {200, 503} and 503 in statuses, statuses
        assert any("stopped" in json.loads(body)["error"] for status, body in results if status == 503)
        c = Client(served.port)
        assert c.call("GET", "/v2/health/live")[0] == 200
        assert c.call("GET", "/v2/health/ready")[0] == 503
        c.close()



def test_a_body_arriving_after_shutdown_closed_the_decode_pool_is_503(slow_model: Path, tmp_path: Path) -> None:
    """Shutdown stops the runtime, then closes the decode pool; a late compressed body (always decoded
    there) is told the server is shutting down (503), never a 500 from the closed pool."""
    folder = _bundle(tmp_path / "bundle", slow_model, "slow")
    with Served(Runtime(folder)) as served:
        served.app.worker.shutdown(wait=True)
        c = Client(served.port)
        body = gzip.compress(json.dumps(_slow_request(0)).encode())
        status, _, answer = c.call("POST", "/v2/models/slow/infer", body,
                                   {"Content-Type": "application/json", "Content-Encoding": "gzip"})
        assert status == 503 and "shutting down" in json.loads(answer)["error"]
        c.close()
