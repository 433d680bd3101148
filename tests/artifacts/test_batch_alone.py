"""A batch-dependent model (runtime.json batch_dependent: dynamic INT8's one activation scale per batch) is served
one request per batch, so one client's rows never move another client's answer (issue 37.1); a real `temper
serve` with concurrent clients, a quiet client beside a loud one."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from temper.artifacts.formats import bundle
from tests.artifacts.composition_models import LOUD, WIDTH, dynamic_twin, matmul_model
from tests.artifacts.servers import Client, _binary_outputs, _counter, _families, _metrics, _temper_serve

CLIENTS, REQUESTS = 8, 25


@pytest.fixture(scope="module")
def twin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("twin")
    return dynamic_twin(matmul_model(folder / "fp32.onnx"), folder / "int8.onnx")


def _rows() -> list[np.ndarray]:
    """One row per client: the first loud, the others quiet."""
    x = np.random.default_rng(5).standard_normal((CLIENTS, WIDTH)).astype(np.float32)
    x[0] *= LOUD
    return [x[i : i + 1] for i in range(CLIENTS)]


def _hammer(port: int, rows: list[np.ndarray]) -> list[list[np.ndarray]]:
    """Every client sends its row REQUESTS times at once with the others; each one's answers."""
    answers: list[list[np.ndarray]] = [[] for _ in rows]
    start = threading.Barrier(len(rows))

    def client(i: int) -> None:
        c = Client(port)
        start.wait()
        for _ in range(REQUESTS):
            request = {"inputs": [{"name": "x", "shape": [1, WIDTH], "datatype": "FP32",
                                   "data": rows[i].ravel().tolist()}],
                       "outputs": [{"name": "y", "parameters": {"binary_data": True}}]}
            status, headers, body = c.infer(request, model="loud")
            assert status == 200, body
            answers[i].append(_binary_outputs(headers, body)["y"])
        c.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(rows))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return answers


def _served(twin: Path, folder: Path, dependent: bool) -> tuple[list[list[np.ndarray]], dict, dict]:
    served = bundle.write(folder, twin, bundle.config_for(twin, "loud", max_batch_size=8, max_delay_ms=5,
                                                         batch_dependent=dependent))
    with _temper_serve(str(served), args=("--instances", "0")) as (port, _):
        answers = _hammer(port, _rows())
        c = Client(port)
        metrics, info = _metrics(c), _families(c)["temper_runtime_info"].samples[0].labels
        c.close()
    return answers, metrics, info


def test_a_batch_dependent_model_answers_every_request_as_if_alone(twin, tmp_path):
    alone = ort.InferenceSession(str(twin), providers=["CPUExecutionProvider"])
    rows = _rows()
    answers, metrics, info = _served(twin, tmp_path / "bundle", dependent=True)
    for row, got in zip(rows, answers):
        (expected,) = alone.run(["y"], {"x": row})
        for answer in got:
            np.testing.assert_allclose(answer, expected, rtol=1e-6, atol=1e-6)
    requests = CLIENTS * REQUESTS
    assert _counter(metrics, "nv_inference_request_success") == requests
    assert _counter(metrics, "nv_inference_exec_count") == requests  # one request per execution
    assert info["batch_alone"] == "true"


def test_the_same_model_unmarked_shares_batches_and_moves_quiet_answers(twin, tmp_path):
    """The control: unmarked, the batcher joins the clients' rows and the loud one moves the quiet ones."""
    alone = ort.InferenceSession(str(twin), providers=["CPUExecutionProvider"])
    rows = _rows()
    answers, metrics, info = _served(twin, tmp_path / "bundle", dependent=False)
    assert _counter(metrics, "nv_inference_exec_count") < CLIENTS * REQUESTS  # batches were shared
    moved = sum(not np.allclose(answer, alone.run(["y"], {"x": row})[0], rtol=1e-3, atol=1e-3)
                for row, got in zip(rows[1:], answers[1:]) for answer in got)
    assert moved > 0 and info["batch_alone"] == "false"
