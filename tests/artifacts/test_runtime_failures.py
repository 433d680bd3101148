"""The serving runtime refusing and failing requests: back-pressure, timeouts, a failing batch, stop
and start, and request validation."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

from temper.artifacts.serving.runtime import Overloaded, RequestError, RequestTimeout, Stopped
from tests.artifacts.runtimes import linear_model, plain, pooling_model, runtime_for, slow_model


def test_a_full_queue_rejects_and_recovers(tmp_path: Path, started) -> None:
    runtime = started(runtime_for(slow_model(tmp_path), tmp_path, max_batch_size=1, max_queue=2))
    x = np.ones((1, 512), np.float32)
    accepted, rejected = [], 0
    for _ in range(20):  # submitting takes microseconds; each batch ~10 ms
        try:
            accepted.append(runtime.submit({"x": x}))
        except Overloaded:
            rejected += 1
    assert rejected
    assert all(f.result(timeout=10)["y"].shape == (1, 1) for f in accepted)
    assert runtime.infer({"x": x})["y"].shape == (1, 1)
    assert runtime.metrics.snapshot()["request_failure"] == rejected
    assert runtime.metrics.snapshot()["failures"] == {"REJECTED": rejected, "CANCELED": 0, "BACKEND": 0, "OTHER": 0}


def test_requests_not_answered_in_time_fail(tmp_path: Path, started) -> None:
    """Not started, nothing drains the queue: deterministic where racing a slow model is not."""
    runtime = runtime_for(linear_model(tmp_path), tmp_path, timeout_s=0.05)
    x = np.ones((1, 4), np.float32)
    waiting = runtime.submit({"x": x})
    with pytest.raises(RequestTimeout):
        runtime.infer({"x": x})  # gives up and cancels its request
    started(runtime)
    assert isinstance(waiting.exception(timeout=10), RequestTimeout)  # expired in the queue, never run
    assert runtime.infer({"x": x})["y"].shape == (1, 3)
    metrics = runtime.metrics.snapshot()
    assert (metrics["request_failure"], metrics["inference_count"]) == (2, 1)
    assert metrics["failures"]["REJECTED"] == 2  # both waited timeout_s, the one its caller gave up on included


def test_a_failing_batch_fails_its_requests_and_serving_continues(tmp_path: Path, started) -> None:
    runtime = started(runtime_for(pooling_model(tmp_path), tmp_path))
    bad = np.array([[99]], np.int64)  # out of the embedding table: ORT raises inside the batch
    with pytest.raises(Exception, match="(?i)indices|out of"):
        runtime.infer({"input_ids": bad, "attention_mask": np.ones_like(bad)})
    good = np.array([[1, 2]], np.int64)
    assert runtime.infer({"input_ids": good, "attention_mask": np.ones_like(good)})["pooled"].shape == (1, 3)
    metrics = runtime.metrics.snapshot()
    assert (metrics["request_failure"], metrics["request_success"]) == (1, 1)
    assert metrics["failures"] == {"REJECTED": 0, "CANCELED": 0, "BACKEND": 1, "OTHER": 0}


def test_a_request_its_caller_gave_up_on_is_canceled_not_run(tmp_path: Path, started) -> None:
    """A caller's own deadline, shorter than timeout_s (a gRPC client's), cancels its queued request:
    the batcher drops it unrun and counts it CANCELED, as Triton's failure reason says."""
    runtime = runtime_for(linear_model(tmp_path), tmp_path, timeout_s=30)
    x = np.ones((1, 4), np.float32)
    given_up = runtime.submit({"x": x})  # not started: it waits in the queue
    assert given_up.cancel()
    started(runtime)
    assert runtime.infer({"x": x})["y"].shape == (1, 3)
    metrics = runtime.metrics.snapshot()
    assert (metrics["request_success"], metrics["execution_count"]) == (1, 1)
    assert metrics["failures"] == {"REJECTED": 0, "CANCELED": 1, "BACKEND": 0, "OTHER": 0}


def test_a_request_running_when_its_caller_gives_up_is_a_failure_not_a_success(tmp_path: Path, started) -> None:
    """The caller got a timeout: the run it left behind finishes, and counts CANCELED, never a success."""
    runtime = started(runtime_for(slow_model(tmp_path), tmp_path, max_batch_size=8))
    x = np.ones((8, 512), np.float32)  # ~80 ms of compute
    future = runtime.submit({"x": x})
    deadline = time.monotonic() + 30
    while not future.running():  # taken into a batch: cancelling it is too late
        assert time.monotonic() < deadline
        time.sleep(0.0005)
    with pytest.raises(RequestTimeout):
        runtime.result(future, 0.0001)
    while runtime.metrics.snapshot()["execution_count"] < 1:
        assert time.monotonic() < deadline
        time.sleep(0.001)
    metrics = runtime.metrics.snapshot()
    assert (metrics["request_success"], metrics["request_failure"]) == (0, 1)
    assert metrics["failures"]["CANCELED"] == 1
    assert runtime.infer({"x": x[:1]})["y"].shape == (1, 1)


def test_ready_only_after_start_and_stop_fails_queued_requests(tmp_path: Path) -> None:
    runtime = runtime_for(linear_model(tmp_path), tmp_path)
    assert not runtime.ready
    queued = runtime.submit({"x": np.ones((1, 4), np.float32)})
    runtime.stop()
    with pytest.raises(RuntimeError, match="stopped"):
        queued.result(timeout=1)
    runtime.start()
    assert runtime.ready
    runtime.stop()
    assert not runtime.ready


def test_submit_after_stop_fails_at_once_and_start_serves_again(tmp_path: Path) -> None:
    """The shutdown order of `temper serve`: the REST lifespan stops the runtime while the gRPC server
    (or a late REST request) may still submit. Nothing drains the queue any more, so a submit must
    fail there and then (Stopped: 503 / UNAVAILABLE), not wait out timeout_s or leave a thread behind."""
    model = linear_model(tmp_path)
    runtime = runtime_for(model, tmp_path, timeout_s=30)
    x = np.ones((1, 4), np.float32)
    queued = runtime.submit({"x": x})  # before start: waits in the queue
    runtime.start()
    assert runtime.inline and queued.result(timeout=10)["y"].shape == (1, 3)
    runtime.stop()
    began = time.perf_counter()
    for inline in (False, True):  # the batcher's queue and the inline path alike
        with pytest.raises(Stopped, match="stopped"):
            runtime.submit({"x": x}, inline=inline)
    with pytest.raises(Stopped):
        runtime.infer({"x": x})
    assert time.perf_counter() - began < 5  # at once, not after timeout_s
    with pytest.raises(RequestError):  # a bad request is still a bad request
        runtime.submit({"x": np.ones((1, 5), np.float32)})
    assert not [t for t in threading.enumerate() if t.name.startswith("temper-batcher-")]
    assert runtime.pending == 0 and not runtime.ready
    metrics = runtime.metrics.snapshot()
    assert (metrics["request_success"], metrics["request_failure"]) == (1, 4)
    runtime.start()
    try:
        np.testing.assert_allclose(runtime.infer({"x": x})["y"], plain(model, {"x": x})["y"], rtol=1e-6)
    finally:
        runtime.stop()


def test_requests_queued_when_the_runtime_stops_fail_with_stopped(tmp_path: Path) -> None:
    runtime = runtime_for(linear_model(tmp_path), tmp_path)
    queued = [runtime.submit({"x": np.full((1, 4), i, np.float32)}) for i in range(3)]  # not started: all wait
    runtime.stop()
    for future in queued:
        assert isinstance(future.exception(timeout=1), Stopped)
    assert runtime.metrics.snapshot()["request_failure"] == runtime.metrics.snapshot()["failures"]["REJECTED"] == 3


IDS = np.ones((2, 5), np.int64)


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ([IDS], "must be a dict"),
        ({"input_ids": IDS, "attention_mask": IDS, "extra": IDS}, "unknown input"),
        ({"input_ids": IDS}, "missing input"),
        ({"input_ids": IDS.tolist(), "attention_mask": IDS}, "numpy array"),
        ({"input_ids": IDS.astype(np.int32), "attention_mask": IDS}, "dtype int32, expected int64"),
        ({"input_ids": IDS[0], "attention_mask": IDS}, "expected rank 2"),
        ({"input_ids": IDS, "attention_mask": IDS[:1]}, "disagree on the number of rows"),
        ({"input_ids": IDS, "attention_mask": IDS[:, :4]}, "disagree on axis-1 length"),
        ({"input_ids": IDS[:0], "attention_mask": IDS[:0]}, "at least one row"),
        ({"input_ids": np.ones((17, 5), np.int64), "attention_mask": np.ones((17, 5), np.int64)},
         "exceed max_batch_size 16"),
    ],
)
def test_malformed_requests_are_rejected(tmp_path: Path, inputs: object, message: str) -> None:
    runtime = runtime_for(pooling_model(tmp_path), tmp_path, pad={"input_ids": 0, "attention_mask": 0})
    with pytest.raises(RequestError, match=message):
        runtime.submit(inputs)
    assert runtime.metrics.snapshot()["failures"] == {"REJECTED": 0, "CANCELED": 0, "BACKEND": 0, "OTHER": 1}


def test_fixed_dims_are_checked(tmp_path: Path) -> None:
    runtime = runtime_for(linear_model(tmp_path), tmp_path)
    with pytest.raises(RequestError, match=r"expected \[-1, 4\]"):
        runtime.submit({"x": np.ones((1, 5), np.float32)})
