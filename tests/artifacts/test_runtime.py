"""The serving runtime on real ONNX Runtime sessions and real threads: results, batching, padding,
back-pressure and request validation."""

from __future__ import annotations

import concurrent.futures
import sys
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from artifacts.bundle import config_for, write
from artifacts.engines import engine_cache
from artifacts.host import usable_cores
from artifacts.runtime import (
    INLINE_MAX_MS,
    Overloaded,
    RequestError,
    RequestTimeout,
    Runtime,
    Stopped,
)

WEIGHTS = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
EMBEDDINGS = np.random.default_rng(1).standard_normal((10, 3)).astype(np.float32)


def save(tmp_path: Path, name: str, nodes: list, inputs: list, outputs: list, initializers: list) -> Path:
    model = helper.make_model(
        helper.make_graph(nodes, name, inputs, outputs, initializers), opset_imports=[helper.make_opsetid("", 17)]
    )
    model.ir_version = 9
    onnx.checker.check_model(model)
    path = tmp_path / name / f"{name}.onnx"
    path.parent.mkdir(parents=True)
    onnx.save(model, path)
    return path


def linear_model(tmp_path: Path) -> Path:
    """y = x @ W: each row's output identifies its input."""
    return save(
        tmp_path, "linear", [helper.make_node("MatMul", ["x", "W"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
        [numpy_helper.from_array(WEIGHTS, "W")],
    )


def pooling_model(tmp_path: Path) -> Path:
    """Token embeddings [batch, seq, 3] and their attention-masked mean [batch, 3]."""
    nodes = [
        helper.make_node("Gather", ["E", "input_ids"], ["tokens"]),
        helper.make_node("Cast", ["attention_mask"], ["maskf"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["maskf", "last"], ["mask3"]),
        helper.make_node("Mul", ["tokens", "mask3"], ["masked"]),
        helper.make_node("ReduceSum", ["masked", "seq"], ["total"], keepdims=0),
        helper.make_node("ReduceSum", ["maskf", "seq"], ["count"], keepdims=1),
        helper.make_node("Div", ["total", "count"], ["pooled"]),
    ]
    ids = [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "seq"]) for n in ("input_ids", "attention_mask")]
    outputs = [
        helper.make_tensor_value_info("tokens", TensorProto.FLOAT, ["batch", "seq", 3]),
        helper.make_tensor_value_info("pooled", TensorProto.FLOAT, ["batch", 3]),
    ]
    constants = [
        numpy_helper.from_array(EMBEDDINGS, "E"),
        numpy_helper.from_array(np.array([2], np.int64), "last"),
        numpy_helper.from_array(np.array([1], np.int64), "seq"),
    ]
    return save(tmp_path, "pooling", nodes, ids, outputs, constants)


def slow_model(tmp_path: Path) -> Path:
    """~10 ms per row on 2 cores (a 512x512 outer product squared): keeps the engine busy."""
    nodes = [
        helper.make_node("Unsqueeze", ["x", "two"], ["column"]),
        helper.make_node("Unsqueeze", ["x", "one"], ["row"]),
        helper.make_node("Mul", ["column", "row"], ["outer"]),
        helper.make_node("MatMul", ["outer", "outer"], ["square"]),
        helper.make_node("ReduceSum", ["square", "one"], ["partial"], keepdims=0),
        helper.make_node("ReduceSum", ["partial", "one"], ["y"], keepdims=1),
    ]
    return save(
        tmp_path, "slow", nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 512])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 1])],
        [numpy_helper.from_array(np.array([1], np.int64), "one"), numpy_helper.from_array(np.array([2], np.int64), "two")],
    )


def runtime_for(model: Path, tmp_path: Path, **serving: object) -> Runtime:
    config = config_for(model, model.stem, **serving)
    return Runtime(write(tmp_path / f"{model.stem}-bundle", model, config))


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


def plain(model: Path, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, inputs)))


def test_results_equal_a_plain_session(tmp_path: Path, started) -> None:
    model = linear_model(tmp_path)
    runtime = started(runtime_for(model, tmp_path, max_batch_size=16))
    assert runtime.engine == "cpu"
    x = np.random.default_rng(2).standard_normal((5, 4)).astype(np.float32)
    np.testing.assert_allclose(runtime.infer({"x": x})["y"], plain(model, {"x": x})["y"], rtol=1e-6)
    many = np.random.default_rng(3).standard_normal((40, 4)).astype(np.float32)  # > max_batch_size: chunked
    np.testing.assert_allclose(runtime.run_batch({"x": many})["y"], plain(model, {"x": many})["y"], rtol=1e-6)


def test_concurrent_clients_share_batches_and_get_their_own_rows(tmp_path: Path, started) -> None:
    model = linear_model(tmp_path)
    runtime = started(runtime_for(model, tmp_path, max_batch_size=16, max_delay_ms=5))
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
    queued = runtime.submit({"input_ids": good, "attention_mask": np.ones_like(good)})  # the batcher must not wait forever
    assert queued.result(timeout=10)["pooled"].shape == (1, 3)
    metrics = runtime.metrics.snapshot()
    assert (metrics["request_failure"], metrics["request_success"], metrics["inline_count"]) == (1, 1, 1)


def test_concurrent_callers_with_inline_allowed_still_share_batches_and_never_overlap_runs(tmp_path: Path, started) -> None:
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


def test_padded_requests_batched_together_match_unbatched_runs(tmp_path: Path, started) -> None:
    model = pooling_model(tmp_path)
    runtime = runtime_for(model, tmp_path, pad={"input_ids": 0, "attention_mask": 0})
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


def test_a_failing_batch_fails_its_requests_and_serving_continues(tmp_path: Path, started) -> None:
    runtime = started(runtime_for(pooling_model(tmp_path), tmp_path))
    bad = np.array([[99]], np.int64)  # out of the embedding table: ORT raises inside the batch
    with pytest.raises(Exception, match="(?i)indices|out of"):
        runtime.infer({"input_ids": bad, "attention_mask": np.ones_like(bad)})
    good = np.array([[1, 2]], np.int64)
    assert runtime.infer({"input_ids": good, "attention_mask": np.ones_like(good)})["pooled"].shape == (1, 3)
    metrics = runtime.metrics.snapshot()
    assert (metrics["request_failure"], metrics["request_success"]) == (1, 1)


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
    assert runtime.metrics.snapshot()["request_failure"] == 3


def test_the_engine_cache_is_in_the_user_cache_folder_unless_overridden(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The same rule as the step cache (platformdirs), so XDG_CACHE_HOME moves both."""
    monkeypatch.delenv("TEMPER_ENGINE_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    if sys.platform.startswith("linux"):
        assert engine_cache() == tmp_path / "xdg" / "temper" / "engines"
    monkeypatch.setenv("TEMPER_ENGINE_CACHE", str(tmp_path / "engines"))
    assert engine_cache() == tmp_path / "engines"


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
        ({"input_ids": np.ones((17, 5), np.int64), "attention_mask": np.ones((17, 5), np.int64)}, "exceed max_batch_size 16"),
    ],
)
def test_malformed_requests_are_rejected(tmp_path: Path, inputs: object, message: str) -> None:
    runtime = runtime_for(pooling_model(tmp_path), tmp_path, pad={"input_ids": 0, "attention_mask": 0})
    with pytest.raises(RequestError, match=message):
        runtime.submit(inputs)
    assert runtime.metrics.snapshot()["request_failure"] == 1


def test_fixed_dims_are_checked(tmp_path: Path) -> None:
    runtime = runtime_for(linear_model(tmp_path), tmp_path)
    with pytest.raises(RequestError, match=r"expected \[-1, 4\]"):
        runtime.submit({"x": np.ones((1, 5), np.float32)})
