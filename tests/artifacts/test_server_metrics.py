"""`temper serve` over real HTTP, what it reports: /metrics as Prometheus text named and typed like
Triton's, and Triton's model config and statistics extensions read by tritonclient."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
from prometheus_client.parser import text_string_to_metric_families

from temper.artifacts.formats import bundle
from temper.artifacts.serving.runtime import Runtime
from temper.artifacts.serving.server import InferenceServer
from tests.artifacts.servers import (
    MODEL,
    Client,
    Served,
    _bundle,
    _counter,
    _expected,
    _families,
    _inputs,
    _json_request,
    _metrics,
)

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
    for name in TRITON_COUNTERS:  # Triton's names and types: counters without a _total suffix
        assert families[name].type == "counter" and {s.name for s in families[name].samples} == {name}
    assert all(_counter(metrics, name) >= 1 for name in TRITON_COUNTERS if name != "nv_inference_request_failure")
    failures = families["nv_inference_request_failure"].samples  # Triton's reasons, each always there
    assert [s.labels["reason"] for s in failures] == ["REJECTED", "CANCELED", "BACKEND", "OTHER"]
    assert families["nv_inference_pending_request_count"].type == "gauge"
    memory = {name: families[name] for name in ("nv_cpu_memory_total_bytes", "nv_cpu_memory_used_bytes")}
    assert {family.type for family in memory.values()} == {"gauge"}
    assert 0 < _counter(metrics, "nv_cpu_memory_used_bytes") < _counter(metrics, "nv_cpu_memory_total_bytes")
    assert _counter(metrics, "nv_inference_pending_request_count") == 0  # nothing queued between requests
    infer_us = _counter(metrics, "nv_inference_compute_infer_duration_us")
    assert _counter(metrics, "nv_inference_request_duration_us") >= infer_us

    latency = families["temper_request_duration_seconds"]
    assert latency.type == "histogram"
    buckets = [(s.labels["le"], s.value) for s in latency.samples if s.name.endswith("_bucket")]
    counts = [v for _, v in buckets]
    assert counts == sorted(counts) and buckets[-1][0] == "+Inf"
    assert (counts[-1] == _counter(metrics, "temper_request_duration_seconds_count")
            == _counter(metrics, "nv_inference_request_success"))
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


def test_metrics_are_prometheus_text_whatever_is_asked_and_labels_escaped(client: Client, tiny: Path,
                                                                         tmp_path: Path) -> None:
    """Triton answers its text format to every scraper, Prometheus's OpenMetrics-first Accept included:
    OpenMetrics requires `_total` on counter samples, so it could not type Triton's counters under their
    names. A model name with a quote, a backslash and a newline survives the escaping."""
    accept = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"  # Prometheus's
    status, headers, body = client.call("GET", "/metrics", headers={"Accept": accept})
    assert status == 200 and headers["content-type"].startswith("text/plain; version=0.0.4"), headers
    lines = body.decode().splitlines()
    assert "# TYPE nv_inference_request_success counter" in lines and "untyped" not in body.decode()
    assert any(line.startswith("nv_inference_request_success{") for line in lines)

    name = 'odd "name" \\ with\nnewline'
    app = InferenceServer(Runtime(_bundle(tmp_path / "odd", tiny / bundle.MODEL, name)))
    text, content_type = app.exposition.render()
    assert content_type.startswith("text/plain; version=0.0.4")
    families = {f.name: f for f in text_string_to_metric_families(text.decode())}
    for family in ("nv_inference_request_success", "nv_inference_request_failure", "temper_batch_size"):
        assert families[family].samples[0].labels["model"] == name, family


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

