"""The serving runtime on real ONNX Runtime sessions and real threads: results, batching and padding,
the intra-op threads it keeps, and where the engine cache lives."""

from __future__ import annotations

import concurrent.futures
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from temper.artifacts.core.host import usable_cores
from temper.artifacts.core.layout import Layout
from temper.artifacts.engines.onnxruntime import engine_cache
from temper.artifacts.formats.bundle import config_for, write
from temper.artifacts.serving.runtime import RequestError, Runtime
from tests.artifacts.runtimes import (
    VAD_AUDIO,
    VAD_STATE,
    WEIGHTS,
    linear_model,
    plain,
    pooling_model,
    runtime_for,
    vad_model,
)

INSTANCES = pytest.mark.parametrize("instances", [0, 2], ids=["in-process", "2-workers"])


@INSTANCES
def test_results_equal_a_plain_session(tmp_path: Path, started, instances: int) -> None:
    model = linear_model(tmp_path)
    runtime = started(runtime_for(model, tmp_path, instances, max_batch_size=16))
    assert runtime.provider == "cpu"
    x = np.random.default_rng(2).standard_normal((5, 4)).astype(np.float32)
    np.testing.assert_allclose(runtime.infer({"x": x})["y"], plain(model, {"x": x})["y"], rtol=1e-6)
    many = np.random.default_rng(3).standard_normal((40, 4)).astype(np.float32)  # > max_batch_size: chunked
    np.testing.assert_allclose(runtime.run_batch({"x": many})["y"], plain(model, {"x": many})["y"], rtol=1e-6)


@INSTANCES
def test_concurrent_clients_share_batches_and_get_their_own_rows(tmp_path: Path, started, instances: int) -> None:
    model = linear_model(tmp_path)
    runtime = started(runtime_for(model, tmp_path, instances, max_batch_size=16, max_delay_ms=5))
    clients = 32
    barrier = threading.Barrier(clients)

    def client(i: int) -> tuple[np.ndarray, np.ndarray]:
        x = np.full((1, 4), i, np.float32)
        barrier.wait()
        return x, runtime.infer({"x": x})["y"]

    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        answers = list(pool.map(client, range(clients)))
    for x, y in answers:
        np.testing.assert_allclose(y, x @ WEIGHTS, rtol=1e-6)
    metrics = runtime.metrics.snapshot()
    assert metrics["request_success"] == clients and metrics["inference_count"] == clients
    assert metrics["execution_count"] < clients  # batches formed
    assert metrics["latency_count"] == clients and metrics["latency_counts"][-1] <= clients


def test_a_lone_sequential_client_never_waits_for_the_batch_delay(tmp_path: Path, started) -> None:
    delay_ms = 200.0
    runtime = started(runtime_for(linear_model(tmp_path), tmp_path, max_delay_ms=delay_ms))
    x = np.ones((1, 4), np.float32)
    began = time.perf_counter()
    for _ in range(20):
        runtime.infer({"x": x})
    per_request_ms = (time.perf_counter() - began) * 1000 / 20
    assert per_request_ms < delay_ms / 10  # a fixed wait would make it >= delay_ms
    assert runtime.metrics.snapshot()["execution_count"] == 20


def test_start_keeps_one_intra_op_thread_or_all_cores_and_reports_which(tmp_path: Path, started) -> None:
    model = linear_model(tmp_path)
    runtime = runtime_for(model, tmp_path)
    assert runtime.batch1_ms is None and runtime.intra_op_threads == usable_cores()
    started(runtime)
    assert runtime.intra_op_threads in {1, usable_cores()}
    assert runtime._session.get_session_options().intra_op_num_threads == runtime.intra_op_threads  # the kept session
    assert runtime.batch1_ms > 0
    x = np.random.default_rng(6).standard_normal((4, 4)).astype(np.float32)
    np.testing.assert_allclose(runtime.infer({"x": x})["y"], plain(model, {"x": x})["y"], rtol=1e-6)


@INSTANCES
def test_padded_requests_batched_together_match_unbatched_runs(tmp_path: Path, started, instances: int) -> None:
    model = pooling_model(tmp_path)
    runtime = runtime_for(model, tmp_path, instances, pad={"input_ids": 0, "attention_mask": 0})
    rng = np.random.default_rng(4)
    requests = []
    for rows, length in ((1, 3), (2, 5), (1, 8)):
        ids = rng.integers(1, 10, (rows, length), dtype=np.int64)
        requests.append({"input_ids": ids, "attention_mask": np.ones_like(ids)})
    futures = [runtime.submit(r) for r in requests]  # queued before start: one batch, deterministically
    started(runtime)
    for request, future in zip(requests, futures):
        got, want = future.result(timeout=10), plain(model, request)
        assert got["tokens"].shape == want["tokens"].shape  # sliced back to the request's own length
        np.testing.assert_allclose(got["tokens"], want["tokens"], rtol=1e-6)
        np.testing.assert_allclose(got["pooled"], want["pooled"], rtol=1e-6)
    assert runtime.metrics.snapshot()["execution_count"] == 1  # warm-up is not counted


def _vad_request(seed: int, rows: int, sr: int | None) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    request = {"audio": rng.standard_normal((rows, VAD_AUDIO)).astype(np.float32),
               "state": rng.standard_normal((2, rows, VAD_STATE)).astype(np.float32)}
    return request if sr is None else {**request, "sr": np.array(sr, np.int64)}


@INSTANCES
def test_requests_join_on_each_inputs_batch_axis_and_a_constant_splits_batches(tmp_path: Path, started,
                                                                                instances: int) -> None:
    """Silero's layout: state [2, batch, 128] joins on axis 1, stateN splits on axis 1; sr is not batched:
    left out, it is runtime.json's 16000; requests sending another value run in a batch of their own."""
    model = vad_model(tmp_path)
    layout = Layout({"audio": 0, "sr": None, "state": 1}, {"prob": 0, "stateN": 1}, {"sr": np.array(16000)})
    config = config_for(model, "vad", layout, max_batch_size=16)
    assert [(s.name, s.shape, s.batch_axis, s.value) for s in config.inputs] == [
        ("audio", [-1, VAD_AUDIO], 0, None), ("sr", [], None, 16000), ("state", [2, -1, VAD_STATE], 1, None)]
    runtime = Runtime(write(tmp_path / "bundle", model, config), instances=instances)
    requests = [_vad_request(1, 1, None), _vad_request(2, 3, 16000), _vad_request(3, 2, 8000),
                _vad_request(4, 2, None), _vad_request(5, 1, 8000)]
    futures = [runtime.submit(r) for r in requests]  # queued before start: batches formed deterministically
    started(runtime)
    for request, future in zip(requests, futures):
        got, want = future.result(timeout=10), plain(model, {"sr": np.array(16000, np.int64), **request})
        assert got["stateN"].shape == want["stateN"].shape == (2, len(request["audio"]), VAD_STATE)
        np.testing.assert_allclose(got["prob"], want["prob"], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got["stateN"], want["stateN"], rtol=1e-5, atol=1e-6)
    metrics = runtime.metrics.snapshot()
    assert metrics["execution_count"] == 2 and sorted(metrics["batches"]) == [3, 6]  # 16000: 1+3+2 rows; 8000: 2+1
    with pytest.raises(RequestError, match="disagree on the number of rows"):
        runtime.infer({"audio": requests[0]["audio"], "state": requests[1]["state"]})
    with pytest.raises(RequestError, match="expected"):
        runtime.infer({**requests[0], "state": np.moveaxis(requests[1]["state"], 1, 0).copy()})  # [3, 2, 128]


def test_the_engine_cache_is_in_the_user_cache_folder_unless_overridden(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The same rule as the step cache (platformdirs), so XDG_CACHE_HOME moves both."""
    monkeypatch.delenv("TEMPER_ENGINE_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    if sys.platform.startswith("linux"):
        assert engine_cache() == tmp_path / "xdg" / "temper" / "engines"
    monkeypatch.setenv("TEMPER_ENGINE_CACHE", str(tmp_path / "engines"))
    assert engine_cache() == tmp_path / "engines"


