"""The serving runtime running a lone request inline, on the caller's thread, when the model is fast
enough: the same answers, checks and counts as a queued request, and never beside a batch."""

from __future__ import annotations

import concurrent.futures
import threading
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from temper.artifacts.serving.runtime import INLINE_MAX_MS, RequestError
from tests.artifacts.runtimes import WEIGHTS, linear_model, plain, pooling_model, runtime_for, slow_model


class OverlapSpy:
    """Wraps a real session and records the most runs ever in progress at once."""

    def __init__(self, session: ort.InferenceSession) -> None:
        self.session, self.active, self.most = session, 0, 0
        self.lock = threading.Lock()

    def run(self, *args: object) -> list:
        with self.lock:
            self.active += 1
            self.most = max(self.most, self.active)
        try:
            return self.session.run(*args)
        finally:
            with self.lock:
                self.active -= 1


def test_sequential_requests_on_a_tiny_model_run_inline_and_equal_a_plain_session(tmp_path: Path, started) -> None:
    model = linear_model(tmp_path)
    runtime = started(runtime_for(model, tmp_path, max_batch_size=16))
    assert runtime.inline and runtime.batch1_ms < INLINE_MAX_MS  # a 4x3 MatMul: microseconds
    rng = np.random.default_rng(5)
    for rows in (1, 3, 16):
        x = rng.standard_normal((rows, 4)).astype(np.float32)
        future = runtime.submit({"x": x}, inline=True)
        assert future.done()  # answered on this thread, before submit returned
        np.testing.assert_allclose(future.result()["y"], plain(model, {"x": x})["y"], rtol=1e-6)
    with pytest.raises(RequestError, match="exceed max_batch_size"):  # the same checks as queued requests
        runtime.submit({"x": np.ones((17, 4), np.float32)}, inline=True)
    metrics = runtime.metrics.snapshot()
    assert metrics["inline_count"] == metrics["execution_count"] == metrics["request_success"] == 3
    assert (metrics["inference_count"], metrics["request_failure"], metrics["latency_count"]) == (20, 1, 3)
    assert metrics["compute_ns"] > 0


def test_an_inline_padded_request_is_sliced_like_a_queued_one(tmp_path: Path, started) -> None:
    model = pooling_model(tmp_path)
    runtime = started(runtime_for(model, tmp_path, pad={"input_ids": 0, "attention_mask": 0}))
    ids = np.array([[1, 2, 3, 4]], np.int64)
    request = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    inline, queued = runtime.submit(request, inline=True).result(timeout=10), runtime.submit(request).result(timeout=10)
    want = plain(model, request)
    for got in (inline, queued):
        assert got["tokens"].shape == want["tokens"].shape
        np.testing.assert_allclose(got["tokens"], want["tokens"], rtol=1e-6)
        np.testing.assert_allclose(got["pooled"], want["pooled"], rtol=1e-6)
    assert runtime.metrics.snapshot()["inline_count"] == 1


def test_a_failing_inline_run_fails_its_request_and_frees_the_engine(tmp_path: Path, started) -> None:
    runtime = started(runtime_for(pooling_model(tmp_path), tmp_path))
    bad = np.array([[99]], np.int64)  # out of the embedding table: ORT raises
    failed = runtime.submit({"input_ids": bad, "attention_mask": np.ones_like(bad)}, inline=True)
    assert failed.done() and failed.exception() is not None
    good = np.array([[1, 2]], np.int64)
    queued = runtime.submit({"input_ids": good,
                             "attention_mask": np.ones_like(good)})  # the batcher must not wait forever
    assert queued.result(timeout=10)["pooled"].shape == (1, 3)
    metrics = runtime.metrics.snapshot()
    assert (metrics["request_failure"], metrics["request_success"], metrics["inline_count"]) == (1, 1, 1)


def test_concurrent_callers_with_inline_allowed_still_share_batches_and_never_overlap_runs(
        tmp_path: Path, started) -> None:
    runtime = started(runtime_for(linear_model(tmp_path), tmp_path, max_batch_size=16, max_delay_ms=5))
    assert runtime.inline
    spy = runtime._session = OverlapSpy(runtime._session)
    clients, rounds = 32, 20
    barrier = threading.Barrier(clients)

    def client(i: int) -> list[tuple[np.ndarray, np.ndarray]]:  # closed loop: next request once answered
        answers = []
        barrier.wait()
        for turn in range(rounds):
            x = np.full((1, 4), i * rounds + turn, np.float32)
            answers.append((x, runtime.submit({"x": x}, inline=True).result(timeout=10)["y"]))
        return answers

    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        answers = [a for found in pool.map(client, range(clients)) for a in found]
    for x, y in answers:
        np.testing.assert_allclose(y, x @ WEIGHTS, rtol=1e-6)
    metrics = runtime.metrics.snapshot()
    assert metrics["request_success"] == clients * rounds
    assert metrics["execution_count"] < clients * rounds  # batches formed
    assert spy.most == 1  # an inline run and a batch never held the engine together


def test_a_model_above_the_inline_threshold_always_goes_through_the_batcher(tmp_path: Path, started) -> None:
    runtime = started(runtime_for(slow_model(tmp_path), tmp_path))
    assert not runtime.inline and runtime.batch1_ms >= INLINE_MAX_MS  # ~10 ms per row
    x = np.ones((1, 512), np.float32)
    for _ in range(3):
        assert runtime.submit({"x": x}, inline=True).result(timeout=10)["y"].shape == (1, 1)
    metrics = runtime.metrics.snapshot()
    assert (metrics["inline_count"], metrics["execution_count"]) == (0, 3)


