"""`/metrics`: the runtime's and the HTTP server's counters as Prometheus metrics, read at scrape time.

One Runtime.metrics snapshot per scrape becomes metric families, so serving a request costs
nothing beyond the Runtime's own counters. The answer is Prometheus's text format 0.0.4, whatever
the Accept header asks, as Triton answers.

Triton's families keep Triton's names, types and labels, so its Grafana dashboards and autoscaling
rules work unchanged: the nv_inference_* counts and cumulative durations are counters without a
`_total` suffix, nv_inference_request_failure has a `reason` label (REJECTED, CANCELED, BACKEND,
OTHER: artifacts/counters.py says which failure is which), and the pending requests and the
host's memory are gauges. They are written here: prometheus_client's text encoder names every
counter `<name>_total` on its TYPE line, and OpenMetrics requires that suffix on counter samples,
so under Triton's names it could only type them `untyped`. temper's own families (latency and
batch-size histograms, start-up choices, HTTP connections) and the process collector (RSS, CPU
seconds, open file descriptors) go through prometheus_client.

The exposition reads the Runtime, the connection counts and the number of requests the server
refused, never the server itself, so the server depends on it and not the other way round.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from typing import Protocol

import psutil
from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

from temper.artifacts.counters import FAILURE_REASONS, OTHER
from temper.artifacts.protocol import VERSION
from temper.artifacts.runtime import Runtime

LABELS = ["model", "version"]
CLOSE_REASONS = ("header_timeout", "body_timeout", "headers_too_large", "evicted", "refused")


class ConnectionCounts(Protocol):
    """What /metrics reads of the HTTP connections (artifacts.http_limits.Connections)."""

    open: int  # connections open now
    closed: Counter[str]  # connections the server closed, by reason (CLOSE_REASONS)


def _triton_families(runtime: Runtime, refused: int) -> list[Metric]:
    """Triton's per-model counters and gauges, and its host memory gauges. `refused` requests, those
    the server turned away before the runtime (which counts everything after that point), are
    failures of reason OTHER."""
    m = runtime.metrics.snapshot()
    model = dict(zip(LABELS, [runtime.config.name, VERSION]))

    def family(name: str, kind: str, help_text: str, value: float, labels: dict[str, str] | None = None) -> Metric:
        metric = Metric(name, help_text, kind)
        metric.add_sample(name, model if labels is None else labels, value)
        return metric

    failures = Metric("nv_inference_request_failure", "Number of failed inference requests, by reason: REJECTED "
                      "(queue full, timed out in the queue, runtime stopping), CANCELED (the caller gave up), "
                      "BACKEND (the model's run failed), OTHER (bad or refused requests)", "counter")
    for reason in FAILURE_REASONS:
        count = m["failures"][reason] + (refused if reason == OTHER else 0)
        failures.add_sample(failures.name, {**model, "reason": reason}, count)
    memory = psutil.virtual_memory()
    return [
        family("nv_inference_request_success", "counter", "Number of successful inference requests",
               m["request_success"]),
        failures,
        family("nv_inference_count", "counter", "Number of inferences performed (a batch of n rows counts n)",
               m["inference_count"]),
        family("nv_inference_exec_count", "counter", "Number of model executions (batches) performed",
               m["execution_count"]),
        family("nv_inference_request_duration_us", "counter", "Cumulative time from submission to answer or "
               "failure of inference requests, in microseconds", (m["success_ns"] + m["failure_ns"]) // 1000),
        family("nv_inference_queue_duration_us", "counter", "Cumulative time requests waited in the queue, in "
               "microseconds", m["queue_ns"] // 1000),
        family("nv_inference_compute_input_duration_us", "counter", "Cumulative time merging requests into "
               "batches, per request, in microseconds", m["compute_input_ns"] // 1000),
        family("nv_inference_compute_infer_duration_us", "counter", "Cumulative model execution time per "
               "request, in microseconds", m["compute_ns"] // 1000),
        family("nv_inference_compute_output_duration_us", "counter", "Cumulative time splitting batch outputs "
               "into requests, per request, in microseconds", m["compute_output_ns"] // 1000),
        family("nv_inference_pending_request_count", "gauge", "Inference requests queued, waiting for a batch",
               runtime.pending),
        family("temper_inline_exec_count", "counter", "Executions run inline on the event loop instead of by "
               "the batcher", m["inline_count"]),
        family("nv_cpu_memory_total_bytes", "gauge", "Total memory of the host, in bytes", memory.total, {}),
        family("nv_cpu_memory_used_bytes", "gauge", "Memory in use on the host (total less available), in bytes",
               memory.total - memory.available, {}),
    ]


def _text(families: list[Metric]) -> str:
    """Counters and gauges in the text format 0.0.4, each under its own name: a counter's TYPE line
    names it as its samples are named, without the `_total` prometheus_client would add."""
    lines = []
    for family in families:
        lines.append(f"# HELP {family.name} {_escaped(family.documentation, quote=False)}")
        lines.append(f"# TYPE {family.name} {family.type}")
        for sample in family.samples:
            labels = ",".join(f'{key}="{_escaped(value)}"' for key, value in sorted(sample.labels.items()))
            lines.append(f"{sample.name}{{{labels}}} {floatToGoString(sample.value)}" if labels else
                         f"{sample.name} {floatToGoString(sample.value)}")
    return "".join(line + "\n" for line in lines)


def _escaped(value: str, quote: bool = True) -> str:
    """A label value (or, without `quote`, a HELP text) as the text format writes it: backslash, line
    feed and double quote escaped."""
    value = value.replace("\\", r"\\").replace("\n", r"\n")
    return value.replace('"', r"\"") if quote else value


class ServingCollector:
    """temper's own metric families from the runtime and the connection counts, built at each scrape."""

    def __init__(self, runtime: Runtime, connections: ConnectionCounts) -> None:
        self.runtime = runtime
        self.connections = connections

    def collect(self) -> Iterator[Metric]:
        model = [self.runtime.config.name, VERSION]
        yield from _runtime_families(self.runtime, model)
        yield from _connection_families(self.connections, model)


def _runtime_families(runtime: Runtime, model: list[str]) -> Iterator[Metric]:
    """Start-up choices, latency and batch sizes."""
    m = runtime.metrics.snapshot()
    info = GaugeMetricFamily("temper_runtime_info", "What start-up chose: engine, intra-op threads, inline runs, "
                             "worker instances (0: in the server's process) (value 1)",
                             labels=[*LABELS, "engine", "intra_op_threads", "inline", "instances"])
    info.add_metric([*model, runtime.engine, str(runtime.intra_op_threads), str(runtime.inline).lower(),
                     str(runtime.instances or 0)], 1)
    yield info

    latency = HistogramMetricFamily("temper_request_duration_seconds", "Time from queueing to answer of "
                                    "successful inference requests", labels=LABELS)
    buckets = [(floatToGoString(ms / 1000), n) for ms, n in zip(m["latency_buckets_ms"], m["latency_counts"])]
    latency.add_metric(model, [*buckets, ("+Inf", m["latency_count"])], m["latency_sum_ms"] / 1000)
    yield latency

    yield _batch_sizes(m["batches"], runtime.max_rows, model, m["inference_count"])
    yield from _instance_families(runtime, model)


def _instance_families(runtime: Runtime, model: list[str]) -> Iterator[Metric]:
    """Per model instance (worker process; the one in-process session with --instances 0): whether it is
    ready, and how often its worker was restarted after dying. Triton has no such series; these follow its
    model and version labels."""
    ready = GaugeMetricFamily("temper_model_instance_ready", "Whether the model instance (worker process) is "
                              "started, warmed up and alive (1) or not (0: starting, restarting, taken out)",
                              labels=[*LABELS, "instance"])
    restarts = CounterMetricFamily("temper_model_instance_restarts", "Times the instance's worker process was "
                                   "started again after it died", labels=[*LABELS, "instance"])
    pool = runtime.pool
    if pool is None:
        ready.add_metric([*model, "0"], float(runtime.ready))
        restarts.add_metric([*model, "0"], 0)
    else:
        for instance in pool.instances:
            ready.add_metric([*model, str(instance.index)], float(instance.ready))
            restarts.add_metric([*model, str(instance.index)], instance.restarts)
    yield ready
    yield restarts


def _connection_families(connections: ConnectionCounts, model: list[str]) -> Iterator[Metric]:
    """Open HTTP connections, and those the server closed by reason."""
    open_now = GaugeMetricFamily("temper_http_connections", "Open HTTP connections", labels=LABELS)
    open_now.add_metric(model, connections.open)
    yield open_now
    closed = CounterMetricFamily("temper_http_connections_closed", "HTTP connections the server closed: "
                                 "headers or body not received in time, headers too large (431), the longest "
                                 "idle one evicted at the connection limit, or refused (503) there",
                                 labels=[*LABELS, "reason"])
    for reason in CLOSE_REASONS:
        closed.add_metric([*model, reason], connections.closed[reason])
    yield closed


def _batch_sizes(batches: dict[int, list[int]], max_rows: int, model: list[str], rows: int) -> HistogramMetricFamily:
    """Executions by batch size (rows), in power-of-two buckets up to max_rows; the sum is the rows run."""
    bounds = sorted({min(1 << i, max_rows) for i in range(max_rows.bit_length() + 1)})
    family = HistogramMetricFamily("temper_batch_size", "Rows per model execution", labels=LABELS)
    buckets = [(floatToGoString(b), sum(v[0] for size, v in batches.items() if size <= b)) for b in bounds]
    family.add_metric(model, [*buckets, ("+Inf", sum(v[0] for v in batches.values()))], rows)
    return family


class Exposition:
    """What /metrics renders: Triton's families, then temper's and the process collector's."""

    def __init__(self, runtime: Runtime, connections: ConnectionCounts, refused: Callable[[], int]) -> None:
        self.runtime = runtime
        self.refused = refused
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(ServingCollector(runtime, connections))
        ProcessCollector(registry=self.registry)

    def render(self) -> tuple[bytes, str]:
        """The body and its content type, the text format 0.0.4."""
        triton = _text(_triton_families(self.runtime, self.refused())).encode()
        return triton + generate_latest(self.registry), CONTENT_TYPE_PLAIN_0_0_4
