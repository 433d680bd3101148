"""`temper serve` over real HTTP, the KServe v2 protocol: health, metadata and inference in JSON and
binary tensor data, from one client and from many at once; answers compared with ONNX Runtime."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from temper.artifacts.core.host import usable_cores
from temper.artifacts.serving.runtime import Runtime
from tests.artifacts.servers import (
    MODEL,
    Client,
    Served,
    _binary_outputs,
    _counter,
    _expected,
    _families,
    _inputs,
    _json_request,
    _metrics,
)

# -- health, metadata ----------------------------------------------------------------------------


def test_health_ready_and_metadata(client: Client) -> None:
    assert client.call("GET", "/v2/health/live")[0] == 200
    assert client.call("GET", "/v2/health/ready")[0] == 200
    assert client.call("GET", f"/v2/models/{MODEL}/ready")[0] == 200
    assert client.call("GET", f"/v2/models/{MODEL}/versions/1/ready")[0] == 200
    status, headers, body = client.call("GET", f"/v2/models/{MODEL}")
    assert status == 200 and headers["content-type"] == "application/json"
    assert json.loads(body) == {
        "name": MODEL, "versions": ["1"], "platform": "onnxruntime_onnx",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]},
                   {"name": "ids", "datatype": "INT64", "shape": [-1, 3]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 2]},
                    {"name": "total", "datatype": "INT64", "shape": [-1, 1]}],
    }
    status, _, body = client.call("GET", "/v2")
    assert status == 200 and "binary_tensor_data" in json.loads(body)["extensions"]


def test_not_ready_until_the_runtime_has_started(tiny: Path) -> None:
    """Without the lifespan startup (no warm-up) the server is live but not ready and serves nothing."""
    runtime = Runtime(tiny)
    with Served(runtime, lifespan="off") as served:
        c = Client(served.port)
        assert c.call("GET", "/v2/health/live")[0] == 200
        assert c.call("GET", "/v2/health/ready")[0] == 503
        assert c.call("GET", f"/v2/models/{MODEL}/ready")[0] == 503
        status, _, body = c.infer(_json_request(_inputs(0)))
        assert status == 503 and "not ready" in json.loads(body)["error"]
        c.close()


# -- inference -----------------------------------------------------------------------------------


@pytest.mark.parametrize("nested", [False, True], ids=["flat", "nested"])
def test_json_infer_equals_onnxruntime(client: Client, reference: ort.InferenceSession, nested: bool) -> None:
    inputs = _inputs(1, rows=3)
    status, headers, body = client.infer({"id": "req-7", **_json_request(inputs, nested)})
    assert status == 200, body
    assert headers["content-type"] == "application/json"
    reply = json.loads(body)
    assert reply["model_name"] == MODEL and reply["id"] == "req-7"
    expected = _expected(reference, inputs)
    assert [o["name"] for o in reply["outputs"]] == ["y", "total"]
    for out in reply["outputs"]:
        want = expected[out["name"]]
        assert out["shape"] == list(want.shape) and out["datatype"] == {"y": "FP32", "total": "INT64"}[out["name"]]
        np.testing.assert_allclose(np.asarray(out["data"]).reshape(out["shape"]), want, rtol=1e-6, atol=1e-6)


def test_requested_outputs_only(client: Client, reference: ort.InferenceSession) -> None:
    inputs = _inputs(2)
    status, _, body = client.infer({**_json_request(inputs), "outputs": [{"name": "total"}]})
    assert status == 200, body
    (out,) = json.loads(body)["outputs"]
    assert out["name"] == "total" and out["data"] == _expected(reference, inputs)["total"].ravel().tolist()


def test_binary_request_and_binary_response_round_trip(client: Client, reference: ort.InferenceSession) -> None:
    inputs = _inputs(3, rows=5)
    request = {
        "inputs": [{"name": "x", "shape": [5, 4], "datatype": "FP32",
                    "parameters": {"binary_data_size": inputs["x"].nbytes}},
                   {"name": "ids", "shape": [5, 3], "datatype": "INT64",
                    "parameters": {"binary_data_size": inputs["ids"].nbytes}}],
        "parameters": {"binary_data_output": True},
    }
    status, headers, body = client.infer(request,
                                         inputs["x"].astype("<f4").tobytes() + inputs["ids"].astype("<i8").tobytes())
    assert status == 200, body
    assert headers["content-type"] == "application/octet-stream"
    reply = json.loads(body[: int(headers["inference-header-content-length"])])
    assert all("data" not in out for out in reply["outputs"])
    got, expected = _binary_outputs(headers, body), _expected(reference, inputs)
    np.testing.assert_allclose(got["y"], expected["y"], rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(got["total"], expected["total"])


def test_per_output_binary_flag_overrides_the_request_default(client: Client, reference: ort.InferenceSession) -> None:
    """JSON inputs; y comes back binary, total as JSON although binary_data_output asks for binary."""
    inputs = _inputs(4)
    request = {**_json_request(inputs), "parameters": {"binary_data_output": True},
               "outputs": [{"name": "y"}, {"name": "total", "parameters": {"binary_data": False}}]}
    status, headers, body = client.infer(request)
    assert status == 200, body
    got, expected = _binary_outputs(headers, body), _expected(reference, inputs)
    reply = json.loads(body[: int(headers["inference-header-content-length"])])
    assert "data" not in reply["outputs"][0] and reply["outputs"][1]["data"] == expected["total"].ravel().tolist()
    np.testing.assert_allclose(got["y"], expected["y"], rtol=1e-6, atol=1e-6)


def test_32_concurrent_clients_get_their_own_answers_in_batches(
        server: Served, reference: ort.InferenceSession) -> None:
    assert server.app.runtime.inline  # batches must form although a lone request would run inline
    watcher = Client(server.port)
    before = _metrics(watcher)
    rounds = 15

    def one_client(index: int) -> list[str]:
        c, problems = Client(server.port), []
        for turn in range(rounds):
            inputs = _inputs(1000 + index * rounds + turn, rows=1 + (index + turn) % 2)
            status, headers, body = c.infer(_json_request(inputs, nested=True) if index % 2 else {
                "inputs": [{"name": k, "shape": list(v.shape), "datatype": {"x": "FP32", "ids": "INT64"}[k],
                            "parameters": {"binary_data_size": v.nbytes}} for k, v in inputs.items()],
                "parameters": {"binary_data_output": True}},
                b"" if index % 2 else inputs["x"].tobytes() + inputs["ids"].tobytes())
            if status != 200:
                problems.append(f"client {index}: HTTP {status} {body[:200]!r}")
                continue
            if index % 2:
                got = {o["name"]: np.asarray(o["data"]).reshape(o["shape"]) for o in json.loads(body)["outputs"]}
            else:
                got = _binary_outputs(headers, body)
            want = _expected(reference, inputs)
            if not (np.allclose(got["y"], want["y"], rtol=1e-5, atol=1e-5)
                    and np.array_equal(got["total"], want["total"])):
                problems.append(f"client {index} turn {turn}: wrong answer")
        c.close()
        return problems

    with ThreadPoolExecutor(32) as pool:
        problems = [p for found in pool.map(one_client, range(32)) for p in found]
    assert problems == []
    after = _metrics(watcher)
    watcher.close()
    delta = {name: _counter(after, name) - _counter(before, name)
             for name in ("nv_inference_request_success", "nv_inference_count", "nv_inference_exec_count")}
    assert delta["nv_inference_request_success"] == 32 * rounds
    assert (delta["nv_inference_exec_count"] < delta["nv_inference_request_success"]
            <= delta["nv_inference_count"]), delta


def test_a_lone_client_runs_inline_and_metrics_report_the_start_up_choice(
        client: Client, reference: ort.InferenceSession) -> None:
    before = _metrics(client)
    for seed in range(20, 25):
        inputs = _inputs(seed)
        status, _, body = client.infer(_json_request(inputs))
        assert status == 200, body
        np.testing.assert_allclose(json.loads(body)["outputs"][0]["data"], _expected(reference, inputs)["y"].ravel(),
                                   rtol=1e-6)
    after = _metrics(client)
    delta = {name: _counter(after, name) - _counter(before, name)
             for name in ("temper_inline_exec_count", "nv_inference_exec_count")}
    assert delta == {"temper_inline_exec_count": 5, "nv_inference_exec_count": 5}
    (info,) = _families(client)["temper_runtime_info"].samples
    assert info.labels["engine"] == "cpu" and info.labels["inline"] == "true" and info.value == 1
    assert int(info.labels["intra_op_threads"]) in {1, usable_cores()}, info
