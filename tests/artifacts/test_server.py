"""`temper serve` over real HTTP: a real uvicorn server on a free loopback port, a tiny real ONNX
model bundle, real concurrent clients. Answers are compared with ONNX Runtime run directly."""

from __future__ import annotations

import contextlib
import gzip
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Self

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import uvicorn
from onnx import TensorProto, helper, numpy_helper
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from artifacts import bundle
from artifacts.host import profile, usable_cores
from artifacts.http_limits import JSON_BYTES_PER_ELEMENT, MAX_BODY_BYTES, MIN_BODY_BYTES, body_limit
from artifacts.runtime import Runtime
from artifacts.server import InferenceServer
from tests.conftest import REPO

MODEL = "tiny"
MAX_BODY = 1024 * 1024


def _tiny_model(path: Path, seed: int = 0) -> Path:
    """y = x @ W + b (FP32 [-1, 2]) and total = row sums of ids (INT64 [-1, 1]); W and b from `seed`."""
    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array(rng.standard_normal((4, 2)).astype(np.float32), "W")
    b = numpy_helper.from_array(rng.standard_normal(2).astype(np.float32), "B")
    axes = numpy_helper.from_array(np.array([1], dtype=np.int64), "axes")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["xw"]), helper.make_node("Add", ["xw", "B"], ["y"]),
         helper.make_node("ReduceSum", ["ids", "axes"], ["total"], keepdims=1)],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4]),
         helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2]),
         helper.make_tensor_value_info("total", TensorProto.INT64, ["batch", 1])],
        [w, b, axes],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _log_model(path: Path) -> Path:
    """y = log(x) (FP32 [-1, 2]): NaN for a negative x, -Inf for 0, for non-finite outputs."""
    graph = helper.make_graph([helper.make_node("Log", ["x"], ["y"])], "log",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _slow_model(path: Path) -> Path:
    """y = sum(relu(tile(x) @ W) chained 24 times): a few milliseconds per row, for queueing tests."""
    rng = np.random.default_rng(1)
    w = numpy_helper.from_array((rng.standard_normal((1024, 1024)) / 32).astype(np.float32), "W")
    repeats = numpy_helper.from_array(np.array([1, 256], dtype=np.int64), "repeats")
    axes = numpy_helper.from_array(np.array([1], dtype=np.int64), "axes")
    nodes = [helper.make_node("Tile", ["x", "repeats"], ["h0"])]
    for i in range(24):
        nodes += [helper.make_node("MatMul", [f"h{i}", "W"], [f"m{i}"]), helper.make_node("Relu", [f"m{i}"], [f"h{i + 1}"])]
    nodes.append(helper.make_node("ReduceSum", ["h24", "axes"], ["y"], keepdims=1))
    graph = helper.make_graph(
        nodes, "slow", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 1])], [w, repeats, axes],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _bundle(folder: Path, model: Path, name: str, **serving: object) -> Path:
    return bundle.write(folder, model, bundle.config_for(model, name, **serving))


class Served:
    """A real uvicorn server in a background thread, on a loopback socket bound to port 0, with the
    protocol and settings `temper serve` uses; `options` go to InferenceServer."""

    def __init__(self, runtime: Runtime, lifespan: str = "on", **options: object) -> None:
        self.app = InferenceServer(runtime, **{"max_body_bytes": MAX_BODY, **options})
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.server = uvicorn.Server(self.app.uvicorn_config(lifespan=lifespan))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> Self:
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "server did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.sock.close()


class Client:
    """One keep-alive HTTP/1.1 connection, as a real client holds it."""

    def __init__(self, port: int) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

    def call(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None) -> tuple[int, dict, bytes]:
        self.conn.request(method, path, body=body, headers=headers or {})
        response = self.conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()

    def infer(self, request: dict, binary: bytes = b"", model: str = MODEL) -> tuple[int, dict, bytes]:
        head = json.dumps(request).encode()
        headers = {"Content-Type": "application/json"}
        if binary:
            headers = {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(head))}
        return self.call("POST", f"/v2/models/{model}/infer", head + binary, headers)

    def close(self) -> None:
        self.conn.close()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tiny")
    return _bundle(root / "bundle", _tiny_model(root / "tiny.onnx"), MODEL, max_batch_size=8, max_delay_ms=2)


@pytest.fixture(scope="module")
def reference(tiny: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(tiny / bundle.MODEL), providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def server(tiny: Path) -> Iterator[Served]:
    with Served(Runtime(tiny)) as served:
        yield served


@pytest.fixture
def client(server: Served) -> Iterator[Client]:
    c = Client(server.port)
    yield c
    c.close()


def _inputs(seed: int, rows: int = 2) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((rows, 4)).astype(np.float32), "ids": rng.integers(0, 1000, (rows, 3)).astype(np.int64)}


def _json_request(inputs: dict[str, np.ndarray], nested: bool = False) -> dict:
    kinds = {"float32": "FP32", "int64": "INT64"}
    return {"inputs": [{"name": k, "shape": list(v.shape), "datatype": kinds[v.dtype.name],
                        "data": v.tolist() if nested else v.ravel().tolist()} for k, v in inputs.items()]}


def _expected(session: ort.InferenceSession, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return dict(zip(["y", "total"], session.run(["y", "total"], inputs)))


def _binary_outputs(headers: dict, body: bytes) -> dict[str, np.ndarray]:
    """Decode a response that uses the binary tensor data extension."""
    length = int(headers["inference-header-content-length"])
    reply, offset, found = json.loads(body[:length]), length, {}
    types = {"FP32": np.float32, "INT64": np.int64}
    for out in reply["outputs"]:
        if "data" in out:
            found[out["name"]] = np.asarray(out["data"], dtype=types[out["datatype"]]).reshape(out["shape"])
            continue
        size = out["parameters"]["binary_data_size"]
        found[out["name"]] = np.frombuffer(body[offset:offset + size], dtype=np.dtype(types[out["datatype"]]).newbyteorder("<")).reshape(out["shape"])
        offset += size
    assert offset == len(body)
    return found


def _families(client: Client) -> dict[str, Metric]:
    """/metrics parsed by prometheus_client's own text-format parser, by family name."""
    status, headers, body = client.call("GET", "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain; version=0.0.4")
    return {family.name: family for family in text_string_to_metric_families(body.decode())}


def _metrics(client: Client) -> dict[tuple[str, tuple], float]:
    """Every sample: (sample name, its labels but model and version, sorted) -> value."""
    return {(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("model", "version")))): s.value
            for family in _families(client).values() for s in family.samples}


def _counter(metrics: dict[tuple[str, tuple], float], name: str, **labels: str) -> float:
    return metrics[name, tuple(sorted(labels.items()))]


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
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}, {"name": "ids", "datatype": "INT64", "shape": [-1, 3]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 2]}, {"name": "total", "datatype": "INT64", "shape": [-1, 1]}],
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
        "inputs": [{"name": "x", "shape": [5, 4], "datatype": "FP32", "parameters": {"binary_data_size": inputs["x"].nbytes}},
                   {"name": "ids", "shape": [5, 3], "datatype": "INT64", "parameters": {"binary_data_size": inputs["ids"].nbytes}}],
        "parameters": {"binary_data_output": True},
    }
    status, headers, body = client.infer(request, inputs["x"].astype("<f4").tobytes() + inputs["ids"].astype("<i8").tobytes())
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


def test_32_concurrent_clients_get_their_own_answers_in_batches(server: Served, reference: ort.InferenceSession) -> None:
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
                "parameters": {"binary_data_output": True}}, b"" if index % 2 else inputs["x"].tobytes() + inputs["ids"].tobytes())
            if status != 200:
                problems.append(f"client {index}: HTTP {status} {body[:200]!r}")
                continue
            if index % 2:
                got = {o["name"]: np.asarray(o["data"]).reshape(o["shape"]) for o in json.loads(body)["outputs"]}
            else:
                got = _binary_outputs(headers, body)
            want = _expected(reference, inputs)
            if not (np.allclose(got["y"], want["y"], rtol=1e-5, atol=1e-5) and np.array_equal(got["total"], want["total"])):
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
    assert delta["nv_inference_exec_count"] < delta["nv_inference_request_success"] <= delta["nv_inference_count"], delta


def test_a_lone_client_runs_inline_and_metrics_report_the_start_up_choice(client: Client, reference: ort.InferenceSession) -> None:
    before = _metrics(client)
    for seed in range(20, 25):
        inputs = _inputs(seed)
        status, _, body = client.infer(_json_request(inputs))
        assert status == 200, body
        np.testing.assert_allclose(json.loads(body)["outputs"][0]["data"], _expected(reference, inputs)["y"].ravel(), rtol=1e-6)
    after = _metrics(client)
    delta = {name: _counter(after, name) - _counter(before, name) for name in ("temper_inline_exec_count", "nv_inference_exec_count")}
    assert delta == {"temper_inline_exec_count": 5, "nv_inference_exec_count": 5}
    (info,) = _families(client)["temper_runtime_info"].samples
    assert info.labels["engine"] == "cpu" and info.labels["inline"] == "true" and info.value == 1
    assert int(info.labels["intra_op_threads"]) in {1, usable_cores()}, info


TRITON_COUNTERS = ("nv_inference_request_success", "nv_inference_request_failure", "nv_inference_count",
                   "nv_inference_exec_count", "nv_inference_request_duration_us", "nv_inference_queue_duration_us",
                   "nv_inference_compute_input_duration_us", "nv_inference_compute_infer_duration_us",
                   "nv_inference_compute_output_duration_us")


def test_metrics_parse_as_prometheus_text_named_like_triton(client: Client) -> None:
    rows = [1, 3, 2]
    for seed, n in enumerate(rows):
        assert client.infer(_json_request(_inputs(50 + seed, rows=n)))[0] == 200
    families = _families(client)
    metrics = _metrics(client)
    for name in TRITON_COUNTERS:  # Triton's names, without a _total suffix, so its dashboards find them
        assert families[name].type == "unknown" and [s.name for s in families[name].samples] == [name]
        assert _counter(metrics, name) >= 1 if name != "nv_inference_request_failure" else _counter(metrics, name) >= 0
    assert families["nv_inference_pending_request_count"].type == "gauge"
    assert _counter(metrics, "nv_inference_pending_request_count") == 0  # nothing queued between requests
    infer_us = _counter(metrics, "nv_inference_compute_infer_duration_us")
    assert _counter(metrics, "nv_inference_request_duration_us") >= infer_us

    latency = families["temper_request_duration_seconds"]
    assert latency.type == "histogram"
    buckets = [(s.labels["le"], s.value) for s in latency.samples if s.name.endswith("_bucket")]
    counts = [v for _, v in buckets]
    assert counts == sorted(counts) and buckets[-1][0] == "+Inf"
    assert counts[-1] == _counter(metrics, "temper_request_duration_seconds_count") == _counter(metrics, "nv_inference_request_success")
    assert _counter(metrics, "temper_request_duration_seconds_sum") > 0

    sizes = families["temper_batch_size"]  # rows per execution; the server has run 1, 2 and 3-row requests by now
    assert sizes.type == "histogram"
    assert [s.labels["le"] for s in sizes.samples if s.name.endswith("_bucket")] == ["1.0", "2.0", "4.0", "8.0", "+Inf"]
    assert _counter(metrics, "temper_batch_size_count") == _counter(metrics, "nv_inference_exec_count")
    assert _counter(metrics, "temper_batch_size_sum") == _counter(metrics, "nv_inference_count")
    up_to = {le: _counter(metrics, "temper_batch_size_bucket", le=le) for le in ("1.0", "4.0")}
    assert up_to["1.0"] < up_to["4.0"]

    assert _counter(metrics, "temper_http_connections") >= 1
    assert _counter(metrics, "temper_http_connections_closed_total", reason="evicted") >= 0
    assert _counter(metrics, "process_resident_memory_bytes") > 10e6
    assert _counter(metrics, "process_cpu_seconds_total") > 0


def test_metrics_in_openmetrics_when_asked_and_labels_escaped(tiny: Path, tmp_path: Path) -> None:
    """A model name with a quote, a backslash and a newline survives both formats' escaping."""
    from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families

    name = 'odd "name" \\ with\nnewline'
    app = InferenceServer(Runtime(_bundle(tmp_path / "odd", tiny / bundle.MODEL, name)))
    text, content_type = app.exposition.render("")
    assert content_type.startswith("text/plain; version=0.0.4")
    (family,) = [f for f in text_string_to_metric_families(text.decode()) if f.name == "nv_inference_request_success"]
    assert family.samples[0].labels == {"model": name, "version": "1"}
    text, content_type = app.exposition.render("application/openmetrics-text; version=1.0.0")
    assert content_type.startswith("application/openmetrics-text") and text.endswith(b"# EOF\n")
    families = {f.name: f for f in openmetrics_families(text.decode())}
    assert families["nv_inference_request_success"].samples[0].labels["model"] == name
    assert families["nv_inference_request_success"].samples[0].name == "nv_inference_request_success"


# -- Triton's extensions, through tritonclient's own HTTP client ---------------------------------


def test_tritonclient_reads_the_model_config_and_statistics_and_infers(server: Served,
                                                                        reference: ort.InferenceSession) -> None:
    import tritonclient.http as triton_http

    triton = triton_http.InferenceServerClient(f"127.0.0.1:{server.port}")
    try:
        assert triton.is_server_live() and triton.is_model_ready(MODEL)
        assert triton.get_model_metadata(MODEL)["platform"] == "onnxruntime_onnx"
        config = triton.get_model_config(MODEL)
        before = triton.get_inference_statistics(MODEL)["model_stats"][0]
        inputs = _inputs(17, rows=3)
        for compression in (None, "gzip", "deflate"):
            tensors = []
            for name, datatype in (("x", "FP32"), ("ids", "INT64")):
                tensor = triton_http.InferInput(name, list(inputs[name].shape), datatype)
                tensor.set_data_from_numpy(inputs[name], binary_data=compression is None)
                tensors.append(tensor)
            outputs = [triton_http.InferRequestedOutput("y", binary_data=True),
                       triton_http.InferRequestedOutput("total", binary_data=False)]
            result = triton.infer(MODEL, tensors, outputs=outputs, request_compression_algorithm=compression)
            want = _expected(reference, inputs)
            np.testing.assert_allclose(result.as_numpy("y"), want["y"], rtol=1e-6, atol=1e-6)
            np.testing.assert_array_equal(result.as_numpy("total"), want["total"])
        after = triton.get_inference_statistics(MODEL)["model_stats"][0]
        every_model = triton.get_inference_statistics()["model_stats"]
    finally:
        triton.close()

    assert config["name"] == MODEL and config["platform"] == "onnxruntime_onnx" and config["max_batch_size"] == 8
    tensors = [(t["name"], t["data_type"], t["dims"]) for t in config["input"] + config["output"]]
    assert tensors == [("x", "TYPE_FP32", [4]), ("ids", "TYPE_INT64", [3]), ("y", "TYPE_FP32", [2]),
                       ("total", "TYPE_INT64", [1])]
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 2000  # the bundle's max_delay_ms
    assert config["instance_group"] == [{"count": 1, "kind": "KIND_CPU"}]

    assert (after["name"], after["version"]) == (MODEL, "1") and [m["name"] for m in every_model] == [MODEL]
    stats, earlier = after["inference_stats"], before["inference_stats"]
    for key in ("success", "queue", "compute_input", "compute_infer", "compute_output"):
        assert stats[key]["count"] - earlier[key]["count"] == 3, key
        assert stats[key]["ns"] > earlier[key]["ns"], key
    assert stats["fail"]["count"] >= 0 and after["inference_count"] - before["inference_count"] == 9
    assert after["execution_count"] - before["execution_count"] == 3 and after["last_inference"] > 0
    by_size = {b["batch_size"]: b for b in after["batch_stats"]}
    assert by_size[3]["compute_infer"]["count"] >= 3 and by_size[3]["compute_infer"]["ns"] > 0


# -- bad requests --------------------------------------------------------------------------------


def _good(inputs: dict[str, np.ndarray]) -> list[dict]:
    return _json_request(inputs)["inputs"]


def _with(index: int, **change: object) -> dict:
    inputs = _good(_inputs(6))
    inputs[index] = {**inputs[index], **change}
    return {"inputs": inputs}


BAD = {
    "malformed JSON": (b'{"inputs": [', "malformed JSON"),
    "not an object": (b"[1, 2]", "JSON object"),
    "no inputs": ({"outputs": []}, '"inputs"'),
    "unknown input": (_with(0, name="z"), "unknown input 'z'"),
    "missing input": ({"inputs": _good(_inputs(6))[:1]}, "missing input"),
    "input given twice": ({"inputs": _good(_inputs(6))[:1] * 2 + _good(_inputs(6))[1:]}, "twice"),
    "wrong datatype": (_with(0, datatype="FP64"), "datatype 'FP64'"),
    "wrong shape for the model": (_with(0, shape=[1, 8], data=[0.5] * 8), "shape"),
    "negative dim": (_with(0, shape=[-2, 4]), "non-negative"),
    "data not matching its shape": (_with(0, shape=[3, 4]), "elements"),
    "data not numbers": (_with(0, data=["a"] * 8), "not FP32"),
    "ragged nested data": (_with(0, data=[[1.0, 2.0, 3.0, 4.0], [1.0]]), "not FP32"),
    "batch over max_batch_size": ({"inputs": _good(_inputs(6, rows=9))}, "max_batch_size"),
    "unknown output": ({"inputs": _good(_inputs(6)), "outputs": [{"name": "nope"}]}, "unknown output"),
    "NaN literal (not JSON)": (b'{"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", '
                               b'"data": [NaN, 1, 2, 3]}]}', "malformed JSON"),
    "NaN as null": (_with(0, data=[None] * 8), "NaN or infinite"),
    "float32 overflow to Inf": (_with(0, data=[1e39] + [0.5] * 7), "NaN or infinite"),
    "nested 100k deep": (b'{"inputs": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "malformed JSON"),
    "id not a string": ({"id": {"a": 1}, "inputs": _good(_inputs(6))}, '"id" must be a string'),
}


@pytest.mark.parametrize("body, message", BAD.values(), ids=BAD.keys())
def test_bad_request_is_400_and_the_server_keeps_serving(client: Client, reference: ort.InferenceSession, body, message: str) -> None:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    status, headers, reply = client.call("POST", f"/v2/models/{MODEL}/infer", raw, {"Content-Type": "application/json"})
    assert status == 400, reply
    assert headers["content-type"] == "application/json" and message in json.loads(reply)["error"]
    inputs = _inputs(7)  # the same keep-alive connection, then the answer is still right
    status, _, reply = client.infer(_json_request(inputs))
    assert status == 200
    np.testing.assert_allclose(json.loads(reply)["outputs"][0]["data"], _expected(reference, inputs)["y"].ravel(), rtol=1e-6)


BAD_BINARY = {
    "size not matching the shape": (lambda x: {"binary_data_size": x.nbytes - 4}, lambda x: x.tobytes(), None, "binary_data_size"),
    "body shorter than declared": (lambda x: {"binary_data_size": x.nbytes}, lambda x: x.tobytes()[:-4], None, "ends"),
    "bytes nobody claims": (lambda x: {"binary_data_size": x.nbytes}, lambda x: x.tobytes() + b"xxxx", None, "no input claims"),
    "header length past the body": (lambda x: {"binary_data_size": x.nbytes}, lambda x: x.tobytes(), "999999", "Inference-Header-Content-Length"),
    "header length not a number": (lambda x: {"binary_data_size": x.nbytes}, lambda x: x.tobytes(), "ten", "Inference-Header-Content-Length"),
}


@pytest.mark.parametrize("params, payload, header, message", BAD_BINARY.values(), ids=BAD_BINARY.keys())
def test_bad_binary_framing_is_400(client: Client, params, payload, header, message: str) -> None:
    inputs = _inputs(8)
    x = inputs["x"]
    head = json.dumps({"inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32", "parameters": params(x)}, _good(inputs)[1]]}).encode()
    headers = {"Inference-Header-Content-Length": header or str(len(head))}
    status, _, reply = client.call("POST", f"/v2/models/{MODEL}/infer", head + payload(x), headers)
    assert status == 400 and message in json.loads(reply)["error"], reply
    assert client.infer(_json_request(_inputs(9)))[0] == 200


def test_a_nan_in_binary_data_is_400(client: Client) -> None:
    inputs = _inputs(14)
    inputs["x"][1, 2] = np.nan
    request = {"inputs": [{"name": k, "shape": list(v.shape), "datatype": {"x": "FP32", "ids": "INT64"}[k],
                           "parameters": {"binary_data_size": v.nbytes}} for k, v in inputs.items()]}
    status, _, reply = client.infer(request, inputs["x"].tobytes() + inputs["ids"].tobytes())
    assert status == 400 and "input 'x' holds NaN or infinite values" in json.loads(reply)["error"], reply


def _strict_json(body: bytes) -> dict:
    """json.loads that refuses NaN and Infinity, which RFC 8259 JSON does not have."""
    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} in the response: not JSON")
    return json.loads(body, parse_constant=refuse)


def test_outputs_json_cannot_carry_fail_with_500_or_come_as_binary(tmp_path: Path) -> None:
    """log(-1) is NaN, log(0) -Inf: never written as bare NaN; binary data carries them."""
    with Served(Runtime(_bundle(tmp_path / "log", _log_model(tmp_path / "log.onnx"), "log"))) as served:
        c = Client(served.port)
        x = np.array([[1.0, -1.0], [0.0, 2.0]], np.float32)
        request = {"inputs": [{"name": "x", "shape": [2, 2], "datatype": "FP32", "data": x.ravel().tolist()}]}
        status, headers, body = c.infer(request, model="log")
        assert status == 500 and headers["content-type"] == "application/json"
        error = _strict_json(body)["error"]
        assert "output 'y' holds NaN or infinite values" in error and "binary" in error
        status, headers, body = c.infer({**request, "parameters": {"binary_data_output": True}}, model="log")
        assert status == 200, body
        y = _binary_outputs(headers, body)["y"]
        assert np.isnan(y[0, 1]) and y[1, 0] == -np.inf and y[1, 1] == pytest.approx(np.log(2))
        finite = {"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1.0, np.e]}]}
        status, _, body = c.infer(finite, model="log")
        assert status == 200 and _strict_json(body)["outputs"][0]["data"] == pytest.approx([0.0, 1.0])
        metrics = _metrics(c)
        c.close()
    assert _counter(metrics, "nv_inference_request_failure") == 1  # the 500: the runtime ran it, the server failed it


def test_gzip_and_deflate_bodies_are_inflated_within_the_limit(client: Client, reference: ort.InferenceSession) -> None:
    inputs = _inputs(15)
    body = json.dumps(_json_request(inputs)).encode()
    url = f"/v2/models/{MODEL}/infer"
    for encoding, packed in (("gzip", gzip.compress(body)), ("deflate", zlib.compress(body)), ("identity", body)):
        status, _, reply = client.call("POST", url, packed, {"Content-Encoding": encoding})
        assert status == 200, (encoding, reply)
        want = _expected(reference, inputs)["y"].ravel()
        np.testing.assert_allclose(json.loads(reply)["outputs"][0]["data"], want, rtol=1e-6)
    head = json.dumps({"inputs": [{"name": k, "shape": list(v.shape), "datatype": {"x": "FP32", "ids": "INT64"}[k],
                                   "parameters": {"binary_data_size": v.nbytes}} for k, v in inputs.items()]}).encode()
    binary = gzip.compress(head + inputs["x"].tobytes() + inputs["ids"].tobytes())  # header length: before compression
    headers = {"Content-Encoding": "gzip", "Inference-Header-Content-Length": str(len(head))}
    status, _, reply = client.call("POST", url, binary, headers)
    assert status == 200, reply
    bomb = gzip.compress(b" " * (MAX_BODY + 1))  # about a kilobyte that inflates past the 1 MiB limit
    assert len(bomb) < 10_000
    refused = {
        "bomb": (bomb, "gzip", 413, "inflates to more than the limit"),
        "corrupt": (b"\x1f\x8b\x08\x00garbage-garbage", "gzip", 400, "corrupt gzip body"),
        "truncated": (gzip.compress(body)[:-12], "gzip", 400, "truncated gzip body"),
        "unknown encoding": (body, "br", 415, "Content-Encoding 'br' is not supported"),
    }
    for case, (payload, encoding, want, message) in refused.items():
        status, _, reply = client.call("POST", url, payload, {"Content-Encoding": encoding})
        assert status == want and message in json.loads(reply)["error"], (case, status, reply)
    assert client.infer(_json_request(_inputs(16)))[0] == 200  # the same keep-alive connection serves on


def test_the_default_body_limit_is_a_full_batch_written_as_json(tiny: Path) -> None:
    config = bundle.read(tiny)  # 8 rows of 7 numbers: far under the floor
    assert body_limit(config) == MIN_BODY_BYTES == InferenceServer(Runtime(tiny)).max_body_bytes
    wide = config.model_copy(update={"max_batch_size": 16,
                                     "inputs": [bundle.TensorSpec(name="x", dtype="float32", shape=[-1, 8192])]})
    assert body_limit(wide) == 16 * 8192 * JSON_BYTES_PER_ELEMENT
    worst = np.random.default_rng(0).standard_normal((16, 8192)).astype(np.float32) * np.float32(-1e-20)  # long reprs
    body = json.dumps({"id": "a-full-batch", "inputs": [{"name": "x", "shape": [16, 8192], "datatype": "FP32",
                                                         "data": worst.tolist()}]}).encode()
    assert body_limit(wide) > len(body) > MIN_BODY_BYTES
    fixed = wide.model_copy(update={"inputs": [bundle.TensorSpec(name="x", dtype="float32", shape=[8, 8192])]})
    assert body_limit(fixed) == 8 * 8192 * JSON_BYTES_PER_ELEMENT  # a fixed batch dim bounds the rows
    text = wide.model_copy(update={"inputs": [bundle.TensorSpec(name="ids", dtype="int64", shape=[-1, -1])]})
    assert body_limit(text) == MAX_BODY_BYTES  # a dynamic sequence length: no size to derive


def test_unknown_model_version_path_and_method(client: Client) -> None:
    status, _, body = client.infer(_json_request(_inputs(10)), model="other")
    assert status == 404 and "unknown model 'other'" in json.loads(body)["error"]
    assert client.call("GET", f"/v2/models/{MODEL}/versions/2")[0] == 404
    assert client.call("GET", "/v3/whatever")[0] == 404
    assert client.call("GET", f"/v2/models/{MODEL}/infer")[0] == 405
    assert client.infer(_json_request(_inputs(10)))[0] == 200


def test_body_over_the_limit_is_413_before_it_is_read(client: Client, server: Served) -> None:
    status, _, body = client.call("POST", f"/v2/models/{MODEL}/infer", b" " * (MAX_BODY + 1))
    assert status == 413 and "over the limit" in json.loads(body)["error"]
    assert client.infer(_json_request(_inputs(11)))[0] == 200
    chunked = Client(server.port)  # no Content-Length: counted while reading
    chunked.conn.request("POST", f"/v2/models/{MODEL}/infer", body=iter([b" " * 65536] * 20), encode_chunked=True)
    response = chunked.conn.getresponse()
    assert response.status == 413 and "over the limit" in json.loads(response.read())["error"]
    chunked.close()
    assert client.infer(_json_request(_inputs(12)))[0] == 200


# -- overload and timeout: a model slow enough for the queue to fill ------------------------------


@pytest.fixture(scope="module")
def slow_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _slow_model(tmp_path_factory.mktemp("slow") / "slow.onnx")


def _slow_request(seed: int, rows: int = 1) -> dict:
    return {"inputs": [{"name": "x", "shape": [rows, 4], "datatype": "FP32", "data": np.random.default_rng(seed).random(rows * 4).tolist()}]}


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
    assert _counter(metrics, "nv_inference_request_failure") >= 1
    assert _counter(metrics, "temper_inline_exec_count") == 0  # milliseconds per run: never on the event loop
    assert info.labels["model"] == "slow" and info.labels["inline"] == "false"


def test_request_not_answered_in_time_is_504(slow_model: Path, tmp_path: Path) -> None:
    folder = _bundle(tmp_path / "bundle", slow_model, "slow", timeout_s=0.001)
    with Served(Runtime(folder)) as served:
        c = Client(served.port)
        status, _, body = c.infer(_slow_request(0, rows=16), model="slow")  # ~100 ms of compute here
        assert status == 504 and "not answered within" in json.loads(body)["error"]
        assert c.call("GET", "/v2/health/live")[0] == 200
        c.close()


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


# -- the CLI -------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve_process(target: str, port: int, env: dict | None = None, prelude: str = "") -> subprocess.Popen:
    """`temper serve TARGET --port PORT` in a new process; `prelude` is Python run first in it."""
    code = prelude + "import sys; from pipeline.cli import main; sys.argv[0] = 'temper'; main()"
    return subprocess.Popen([sys.executable, "-c", code, "serve", target, "--port", str(port)], cwd=REPO,
                            env={**os.environ, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_ready(process: subprocess.Popen, port: int) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()
        try:
            c = Client(port)
            ready = c.call("GET", "/v2/health/ready")[0] == 200
            c.close()
            if ready:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError("temper serve did not become ready")


@contextlib.contextmanager
def _temper_serve(target: str, env: dict | None = None, prelude: str = "") -> Iterator[tuple[int, dict[str, str]]]:
    """`temper serve TARGET` in a new process, ready: its port, and its output once stopped with Ctrl-C."""
    port = _free_port()
    process = _serve_process(target, port, env, prelude)
    output: dict[str, str] = {}
    try:
        _wait_ready(process, port)
        yield port, output
    finally:
        process.send_signal(signal.SIGINT)
        output["stdout"], output["stderr"] = process.communicate(timeout=30)
    # a graceful stop; main() may report the Ctrl-C uvicorn re-raises after shutting down as 128 + SIGINT
    assert process.returncode in (0, 128 + signal.SIGINT) and "Traceback" not in output["stderr"], output["stderr"]


def _infer_checked(port: int, reference: ort.InferenceSession, model: str = MODEL) -> None:
    c = Client(port)
    inputs = _inputs(13)
    status, _, body = c.infer(_json_request(inputs), model=model)
    c.close()
    assert status == 200, body
    want = _expected(reference, inputs)["y"].ravel()
    np.testing.assert_allclose(json.loads(body)["outputs"][0]["data"], want, rtol=1e-6)


def _serve_and_infer(target: str, reference: ort.InferenceSession, env: dict | None = None) -> str:
    with _temper_serve(target, env) as (port, output):
        _infer_checked(port, reference)
    return output["stdout"]


def test_temper_serve_a_bundle_folder(tiny: Path, reference: ort.InferenceSession) -> None:
    stdout = _serve_and_infer(str(tiny), reference)
    assert "127.0.0.1" in stdout and f"/v2/models/{MODEL}" in stdout


def test_temper_serve_a_registered_model(temper, tiny: Path, reference: ort.InferenceSession, tracking_store: str,
                                        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Also the unknown-alias error, in the same store: creating an MLflow sqlite store takes seconds."""
    import mlflow
    from mlflow.tracking._model_registry import utils as registry
    from mlflow.tracking._tracking_service import utils as tracking

    from artifacts.pyfunc import log_bundle

    # set_tracking_uri / set_registry_uri set globals (and MLFLOW_REGISTRY_URI) that would outlive this
    # test: later tests would register into this store
    monkeypatch.setattr(tracking, "_tracking_uri", tracking._tracking_uri)
    monkeypatch.setattr(registry, "_registry_uri", registry._registry_uri)
    monkeypatch.setenv("MLFLOW_REGISTRY_URI", tracking_store)
    client = mlflow.MlflowClient(tracking_store, tracking_store)
    mlflow.set_tracking_uri(tracking_store)
    mlflow.set_registry_uri(tracking_store)
    experiment = client.create_experiment("serve-test", artifact_location=(tmp_path / "artifacts").as_uri())
    with mlflow.start_run(experiment_id=experiment):
        info = log_bundle(tiny, name="model")
    version = mlflow.register_model(info.model_uri, MODEL)
    client.set_registered_model_alias(MODEL, "champion", version.version)
    _serve_and_infer(f"models:/{MODEL}@champion", reference, {"MLFLOW_TRACKING_URI": tracking_store})
    result = temper("serve", f"models:/{MODEL}@no-such-alias")
    lines = result.stderr.strip().splitlines()
    assert result.code == 2 and len(lines) == 1 and lines[0].startswith(f"error: models:/{MODEL}@no-such-alias: MODEL: "), result.stderr


def _run_output(folder: Path, tiny: Path, selected: str, publish: dict | None) -> Path:
    """An output folder as `temper run` writes it: baseline/ and int8/ models (other weights), the
    manifest with the resolved recipe, the report naming the selection."""
    for name, seed in (("baseline", 0), ("int8", 5)):
        (folder / name).mkdir(parents=True)
        _tiny_model(folder / name / bundle.MODEL, seed)
    recipe = {"name": "tiny-recipe", "version": 1, **({"publish": publish} if publish else {})}
    manifest = {"recipe": {"name": "tiny-recipe", "file": "tiny.yaml", "resolved": recipe},
                "baseline": {"path": "baseline/model.onnx"}}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    (folder / "report.json").write_text(json.dumps({"selected": selected, "host": profile().model_dump(mode="json")}))
    return folder


def test_temper_serve_a_run_output_folder_without_publishing(tiny: Path, tmp_path: Path) -> None:
    """OUTPUT serves its selection with the recipe's publish.serving options; OUTPUT/CANDIDATE that
    model, under the recipe's name when there is no publish section, with default options."""
    serving = {"max_batch_size": 4, "max_delay_ms": 1.0, "max_queue": 64, "timeout_s": 10.0, "pad": {}}
    output = _run_output(tmp_path / "out", tiny, "int8", {"mlflow": {"registered_model": MODEL}, "serving": serving})
    int8 = ort.InferenceSession(str(output / "int8" / bundle.MODEL), providers=["CPUExecutionProvider"])
    with _temper_serve(str(output)) as (port, _):
        _infer_checked(port, int8)
        c = Client(port)
        config = json.loads(c.call("GET", f"/v2/models/{MODEL}/config")[2])
        c.close()
    assert config["max_batch_size"] == 4 and config["dynamic_batching"]["max_queue_delay_microseconds"] == 1000

    baseline = ort.InferenceSession(str(output / "baseline" / bundle.MODEL), providers=["CPUExecutionProvider"])
    no_publish = _run_output(tmp_path / "plain", tiny, "int8", None)
    with _temper_serve(str(no_publish / "baseline")) as (port, output_text):
        _infer_checked(port, baseline, model="tiny-recipe")
        c = Client(port)
        config = json.loads(c.call("GET", "/v2/models/tiny-recipe/config")[2])
        c.close()
    assert config["max_batch_size"] == 16 and "/v2/models/tiny-recipe" in output_text["stdout"]


def test_temper_serve_a_run_output_folder_refuses_what_it_cannot_serve(temper, tiny: Path, tmp_path: Path) -> None:
    output = _run_output(tmp_path / "out", tiny, "int8", None)
    (output / "fp16").mkdir()  # a candidate that failed: no model
    report = json.loads((output / "report.json").read_text())
    for target, problem in ((output / "fp16", "cannot serve it from its run"),
                            (output / "nothing", "neither a serving bundle")):
        result = temper("serve", target)
        (line,) = result.stderr.strip().splitlines()
        assert result.code == 2 and problem in line and "serving" not in result.stdout, result.stderr
    (output / "report.json").write_text(json.dumps({"host": report["host"]}))  # not validated: no selection
    result = temper("serve", output)
    assert result.code == 2 and "names no selected model" in result.stderr


def test_temper_serve_on_a_busy_port_says_so_in_one_line(temper, tiny: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = temper("serve", tiny, "--port", port)
    (line,) = result.stderr.strip().splitlines()
    assert result.code == 3 and "serving" not in result.stdout, result
    assert line.startswith(f"error: --port: cannot listen on 127.0.0.1:{port}") and "in use" in line, line


def test_temper_serve_rejects_what_is_not_a_bundle(temper, tmp_path: Path) -> None:
    result = temper("serve", tmp_path / "nothing-here")
    assert result.code == 2
    assert "error:" in result.stderr and "nothing-here" in result.stderr and "models:/" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
