"""Isolated inference workers (artifacts/serving/workers.py): a real server whose model runs in worker
processes, real concurrent HTTP clients, and real signals sent to a worker while they run.

Every request must be answered, 200 with exactly ONNX Runtime's answer or 503 for the one batch the
dead worker held; the restart shows in /metrics and readiness comes back."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import psutil
import pytest

from temper.artifacts.serving.runtime import Runtime, default_instances
from temper.artifacts.serving.tensor_memory import Region
from tests.artifacts.runtimes import linear_model, plain, pooling_model, runtime_for, slow_model
from tests.artifacts.servers import (
    Client,
    Served,
    _counter,
    _expected,
    _families,
    _free_port,
    _inputs,
    _json_request,
    _metrics,
    _wait_ready,
)
from tests.helpers import REPO

CLIENTS, REQUESTS = 8, 40
MAX_BATCH = 8  # the tiny bundle's max_batch_size (tests/artifacts/conftest.py)


def _wait(condition, what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _decoded(body: bytes) -> dict[str, np.ndarray]:
    types = {"FP32": np.float32, "INT64": np.int64}
    return {o["name"]: np.asarray(o["data"], dtype=types[o["datatype"]]).reshape(o["shape"])
            for o in json.loads(body)["outputs"]}


@pytest.mark.parametrize(("instances", "kill"), [(2, signal.SIGKILL), (2, signal.SIGSEGV), (1, signal.SIGKILL)],
                         ids=["2-SIGKILL", "2-SIGSEGV", "1-SIGKILL"])
def test_worker_killed_under_load(tiny: Path, reference: ort.InferenceSession, instances: int,
                                  kill: signal.Signals) -> None:
    """8 clients x 40 requests; a worker is sent `kill` after the first answers. Each answer is right or a 503
    naming the dead worker, at most one batch of them; the instance restarts and serves again. With one
    instance, requests arriving while it restarts wait in the queue for it."""
    runtime = Runtime(tiny, instances=instances)
    with Served(runtime) as served:
        victim = runtime.pool.instances[0]
        first_pid = victim.pid
        answered = threading.Semaphore(0)
        outcomes: list[tuple[int, bytes, dict[str, np.ndarray]]] = []
        lock = threading.Lock()

        def client(seed: int) -> None:
            c = Client(served.port)
            try:
                for i in range(REQUESTS):
                    inputs = _inputs(seed * 1000 + i, rows=1)
                    status, _, body = c.infer(_json_request(inputs))
                    with lock:
                        outcomes.append((status, body, _expected(reference, inputs)))
                    answered.release()
            finally:
                c.close()

        threads = [threading.Thread(target=client, args=(s,)) for s in range(CLIENTS)]
        for t in threads:
            t.start()
        for _ in range(CLIENTS * 2):  # load is running
            assert answered.acquire(timeout=60)
        os.kill(first_pid, kill)
        for t in threads:
            t.join(120)
        assert not any(t.is_alive() for t in threads)

        assert len(outcomes) == CLIENTS * REQUESTS  # every request answered
        lost = [body for status, body, _ in outcomes if status == 503]
        assert {status for status, _, _ in outcomes} <= {200, 503}
        assert len(lost) <= MAX_BATCH, f"{len(lost)} requests lost: more than the one batch the worker held"
        for body in lost:
            assert "died running this request's batch" in json.loads(body)["error"]
        for status, body, expected in outcomes:
            if status == 200:
                outputs = _decoded(body)
                np.testing.assert_allclose(outputs["y"], expected["y"], rtol=1e-6, atol=1e-6)
                np.testing.assert_array_equal(outputs["total"], expected["total"])

        c = Client(served.port)
        try:
            _wait(lambda: victim.ready and victim.pid != first_pid, "the killed instance to restart")
            metrics = _metrics(c)
            assert _counter(metrics, "temper_model_instance_restarts_total", instance="0") == 1
            for other in range(1, instances):
                assert _counter(metrics, "temper_model_instance_restarts_total", instance=str(other)) == 0
            for index in range(instances):
                assert _counter(metrics, "temper_model_instance_ready", instance=str(index)) == 1
            assert c.call("GET", "/v2/health/ready")[0] == 200
            assert _counter(metrics, "nv_inference_request_failure", reason="BACKEND") == len(lost)
            assert _counter(metrics, "nv_inference_request_success") == CLIENTS * REQUESTS - len(lost)
            inputs = _inputs(7, rows=3)  # the restarted worker answers, right
            for _ in range(4):
                status, _, body = c.infer(_json_request(inputs))
                assert status == 200
                np.testing.assert_allclose(_decoded(body)["y"], _expected(reference, inputs)["y"], rtol=1e-6)
        finally:
            c.close()


def test_worker_that_keeps_dying_is_taken_out(tiny: Path, caplog: pytest.LogCaptureFixture) -> None:
    """One instance killed three times within a minute is not restarted again, with one log line; with no
    instance left the model is not ready and a request is a 503 at once."""
    runtime = Runtime(tiny, instances=1)
    with Served(runtime) as served:
        instance = runtime.pool.instances[0]
        for _ in range(3):
            pid = instance.pid
            _wait(lambda: instance.ready, "the instance to be ready")  # noqa: B023 - waited on at once
            os.kill(pid, signal.SIGKILL)
            _wait(lambda: instance.pid != pid or instance.removed, "the death to be seen")  # noqa: B023
        _wait(lambda: instance.removed, "the instance to be taken out")
        assert not instance.ready and instance.restarts == 2
        taken_out = [r for r in caplog.records if "taken out" in r.getMessage()]
        assert len(taken_out) == 1 and "died 3 times" in taken_out[0].getMessage()
        c = Client(served.port)
        try:
            assert c.call("GET", "/v2/health/ready")[0] == 503
            assert c.call("GET", "/v2/models/tiny/ready")[0] == 503
            status, _, body = c.infer(_json_request(_inputs(1, rows=1)))
            assert status == 503, body
            assert _counter(_metrics(c), "temper_model_instance_ready", instance="0") == 0
        finally:
            c.close()


def test_instances_in_config(tiny: Path) -> None:
    """/config's instance_group says how many worker instances really run, and each is its own process."""
    runtime = Runtime(tiny, instances=2)
    with Served(runtime) as served:
        c = Client(served.port)
        try:
            status, _, body = c.call("GET", "/v2/models/tiny/config")
            assert status == 200
            assert json.loads(body)["instance_group"][0]["count"] == 2
        finally:
            c.close()
        pids = {i.pid for i in runtime.pool.instances}
        assert len(pids) == 2 and os.getpid() not in pids
        assert all(i.process is not None and i.process.poll() is None for i in runtime.pool.instances)
    assert all(i.process is not None and i.process.poll() is not None for i in runtime.pool.instances)


def test_region_grows_and_the_other_side_follows() -> None:
    """A batch larger than a region is written after growing the same memory file; a second mapping of it
    (the other process's) reads it after following the size the descriptor names."""
    writer = Region.create("test-in", 1024)
    reader = Region(os.dup(writer.fd), writer.size)
    try:
        small = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.array([[1, 2]], dtype=np.int64)}
        out = reader.read(writer.write(small), writer.size, copy=True)
        assert out.keys() == small.keys()
        for name in small:
            np.testing.assert_array_equal(out[name], small[name])
        big = {"a": np.random.default_rng(0).standard_normal((300, 500)).astype(np.float32)}
        descriptor = writer.write(big)
        assert writer.size >= big["a"].nbytes > reader.size
        view = reader.read(descriptor, writer.size, copy=False)["a"]
        np.testing.assert_array_equal(view, big["a"])
        assert reader.size == writer.size
    finally:
        writer.close()
        reader.close()


def test_the_batch_a_worker_held_when_it_died_is_a_503(tiny: Path, reference: ort.InferenceSession) -> None:
    """Deterministically: the worker is stopped (SIGSTOP) so the request's batch waits in it, then killed; that
    request alone is a 503 naming the death, a BACKEND failure, and the next one is answered right."""
    runtime = Runtime(tiny, instances=1)
    with Served(runtime) as served:
        instance = runtime.pool.instances[0]
        pid = instance.pid
        os.kill(pid, signal.SIGSTOP)
        answers: list[tuple[int, bytes]] = []
        c = Client(served.port)
        request = threading.Thread(target=lambda: answers.append(c.infer(_json_request(_inputs(3, rows=2)))[::2]))
        request.start()
        _wait(lambda: runtime.pool.idle_count == 0, "the batch to reach the worker")
        os.kill(pid, signal.SIGKILL)
        request.join(30)
        ((status, body),) = answers
        assert status == 503 and "died running this request's batch; not retried" in json.loads(body)["error"]
        _wait(lambda: instance.ready, "the restart")
        inputs = _inputs(4, rows=2)
        status, _, body = c.infer(_json_request(inputs))
        assert status == 200
        np.testing.assert_allclose(_decoded(body)["y"], _expected(reference, inputs)["y"], rtol=1e-6)
        metrics = _metrics(c)
        assert _counter(metrics, "nv_inference_request_failure", reason="BACKEND") == 1
        assert _counter(metrics, "temper_model_instance_restarts_total", instance="0") == 1
        c.close()


def test_temper_serve_instances_and_ctrl_c_to_the_whole_group(tiny: Path, reference: ort.InferenceSession) -> None:
    """`temper serve --instances 2` answers right from two worker processes; Ctrl-C in a terminal signals
    the whole process group: the server drains and exits cleanly, no worker prints a traceback or outlives it."""
    port = _free_port()
    code = "import sys; from temper.pipeline.cli import main; sys.argv[0] = 'temper'; main()"
    process = subprocess.Popen([sys.executable, "-c", code, "serve", str(tiny), "--port", str(port), "--instances",
                                "2"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        _wait_ready(process, port)
        workers = [p for p in psutil.Process(process.pid).children(recursive=True)
                   if "temper.artifacts.serving.worker" in " ".join(p.cmdline())]
        assert len(workers) == 2
        c = Client(port)
        inputs = _inputs(9, rows=3)
        status, _, body = c.infer(_json_request(inputs))
        assert status == 200
        np.testing.assert_allclose(_decoded(body)["y"], _expected(reference, inputs)["y"], rtol=1e-6)
        info = _families(c)["temper_runtime_info"].samples[0].labels
        assert info["instances"] == "2"
        c.close()
    finally:
        os.killpg(process.pid, signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
    assert process.returncode in (0, 128 + signal.SIGINT) and "Traceback" not in stderr, stderr
    assert "died" not in stderr, stderr  # no worker was lost while the server drained
    psutil.wait_procs(workers, timeout=10)
    assert not any(w.is_running() and w.status() != psutil.STATUS_ZOMBIE for w in workers)


def test_a_batch_larger_than_the_regions_grows_them(tmp_path: Path, started) -> None:
    """Token inputs far longer than the regions were sized for (dynamic dims at DYNAMIC_DIM_GUESS) grow the
    input region (gateway) and the output region (worker), and the answers still equal a plain session's."""
    model = pooling_model(tmp_path)
    runtime = started(runtime_for(model, tmp_path, 1, pad={"input_ids": 0, "attention_mask": 0}))
    instance = runtime.pool.instances[0]
    sizes = instance.inputs.size, instance.outputs.size
    rng = np.random.default_rng(8)
    for length in (5, 6000, 12000, 7):
        ids = rng.integers(1, 10, (2, length), dtype=np.int64)
        request = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
        got, want = runtime.infer(request), plain(model, request)
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-6)
    assert instance.inputs.size > sizes[0] and instance.outputs.size > sizes[1]


def test_default_instances_keep_an_inline_model_in_process_and_isolate_a_slower_one(tmp_path: Path, started) -> None:
    """instances=None (temper serve's default): a model that runs inline stays in this process; one that does
    not gets usable cores over its intra-op threads, in worker processes."""
    tiny = started(runtime_for(linear_model(tmp_path), tmp_path, None))
    assert tiny.inline and tiny.instances == 0 and tiny.pool is None
    heavy = slow_model(tmp_path)
    slow = started(runtime_for(heavy, tmp_path, None, max_batch_size=2))
    assert not slow.inline, f"batch-1 run {slow.batch1_ms} ms"
    assert slow.instances == default_instances(slow.intra_op_threads, False) >= 1
    assert slow.pool is not None and slow.pool.ready_count == slow.instances
    x = np.ones((2, 512), np.float32)
    np.testing.assert_allclose(slow.infer({"x": x})["y"], plain(heavy, {"x": x})["y"], rtol=1e-5)


def test_start_after_stop_starts_new_workers(tmp_path: Path, started) -> None:
    model = linear_model(tmp_path)
    runtime = started(runtime_for(model, tmp_path, 1))
    first = runtime.pool.instances[0].process
    runtime.stop()
    assert first.poll() is not None and not runtime.ready
    runtime.start()
    assert runtime.ready and runtime.pool.instances[0].process is not first
    x = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_allclose(runtime.infer({"x": x})["y"], plain(model, {"x": x})["y"], rtol=1e-6)
