"""`/metrics`: the runtime's and the HTTP server's counters as Prometheus metrics, read at scrape time.

A custom prometheus_client collector turns one Runtime.metrics snapshot into metric families
when Prometheus scrapes, so serving a request costs nothing beyond the Runtime's own counters;
prometheus_client writes them (escaping, text format 0.0.4, or OpenMetrics when the scraper asks
for it). The process collector adds RSS, CPU seconds and open file descriptors.

Names follow Triton's (nv_inference_*), so its Grafana dashboards and autoscaling rules work
unchanged. Triton exposes those counters without the `_total` suffix that prometheus_client (and
OpenMetrics) require of a counter, so they are typed `unknown` (`untyped` in the text format):
that keeps their names identical in both formats; PromQL's rate() treats them as counters alike.
temper's own new counters are proper counters (`_total`).

The exposition reads the Runtime, the connection counts and the number of requests the server
refused, never the server itself, so the server depends on it and not the other way round.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    UnknownMetricFamily,
)
from prometheus_client.utils import floatToGoString

from temper.artifacts.protocol import VERSION
from temper.artifacts.runtime import Runtime

LABELS = ["model", "version"]
CLOSE_REASONS = ("header_timeout", "body_timeout", "evicted", "refused")


class ConnectionCounts(Protocol):
    """What /metrics reads of the HTTP connections (artifacts.http_limits.Connections)."""

    open: int  # connections open now
    closed: Counter[str]  # connections the server closed, by reason (CLOSE_REASONS)


class ServingCollector:
    """Metric families from the runtime's counters and the connection counts, built at each scrape.

    `refused` says how many inference requests the server turned away before they reached the
    runtime (which counts everything after that point); they count as failures.
    """

    def __init__(self, runtime: Runtime, connections: ConnectionCounts, refused: Callable[[], int]) -> None:
        self.runtime = runtime
        self.connections = connections
        self.refused = refused

    def collect(self) -> Iterator[Metric]:
        model = [self.runtime.config.name, VERSION]
        yield from _runtime_families(self.runtime, self.refused(), model)
        yield from _connection_families(self.connections, model)


def _runtime_families(runtime: Runtime, refused: int, model: list[str]) -> Iterator[Metric]:
    """The runtime's counters under Triton's names, its queue, start-up choices, latency and batch sizes."""
    m = runtime.metrics.snapshot()

    def triton(name: str, help_text: str, value: float) -> UnknownMetricFamily:
        family = UnknownMetricFamily(name, help_text + " (a counter, Triton's name)", labels=LABELS)
        family.add_metric(model, value)
        return family

    yield triton("nv_inference_request_success", "Number of successful inference requests", m["request_success"])
    yield triton("nv_inference_request_failure", "Number of failed inference requests, those refused before "
                 "the runtime included", m["request_failure"] + refused)
    yield triton("nv_inference_count", "Number of inferences performed (a batch of n rows counts n)",
                 m["inference_count"])
    yield triton("nv_inference_exec_count", "Number of model executions (batches) performed", m["execution_count"])
    yield triton("nv_inference_request_duration_us", "Cumulative time from submission to answer or failure of "
                 "inference requests, in microseconds", (m["success_ns"] + m["failure_ns"]) // 1000)
    yield triton("nv_inference_queue_duration_us", "Cumulative time requests waited in the queue, in microseconds",
                 m["queue_ns"] // 1000)
    yield triton("nv_inference_compute_input_duration_us", "Cumulative time merging requests into batches, per "
                 "request, in microseconds", m["compute_input_ns"] // 1000)
    yield triton("nv_inference_compute_infer_duration_us", "Cumulative model execution time per request, in "
                 "microseconds", m["compute_ns"] // 1000)
    yield triton("nv_inference_compute_output_duration_us", "Cumulative time splitting batch outputs into "
                 "requests, per request, in microseconds", m["compute_output_ns"] // 1000)
    yield triton("temper_inline_exec_count", "Executions run inline on the event loop instead of by the batcher",
                 m["inline_count"])

    pending = GaugeMetricFamily("nv_inference_pending_request_count", "Inference requests queued, waiting for "
                                "a batch", labels=LABELS)
    pending.add_metric(model, runtime.pending)
    yield pending

    info = GaugeMetricFamily("temper_runtime_info", "What start-up chose: engine, intra-op threads, inline runs "
                             "(value 1)", labels=[*LABELS, "engine", "intra_op_threads", "inline"])
    info.add_metric([*model, runtime.engine, str(runtime.intra_op_threads), str(runtime.inline).lower()], 1)
    yield info

    latency = HistogramMetricFamily("temper_request_duration_seconds", "Time from queueing to answer of "
                                    "successful inference requests", labels=LABELS)
    buckets = [(floatToGoString(ms / 1000), n) for ms, n in zip(m["latency_buckets_ms"], m["latency_counts"])]
    latency.add_metric(model, [*buckets, ("+Inf", m["latency_count"])], m["latency_sum_ms"] / 1000)
    yield latency

    yield _batch_sizes(m["batches"], runtime.max_rows, model, m["inference_count"])


def _connection_families(connections: ConnectionCounts, model: list[str]) -> Iterator[Metric]:
    """Open HTTP connections, and those the server closed by reason."""
    open_now = GaugeMetricFamily("temper_http_connections", "Open HTTP connections", labels=LABELS)
    open_now.add_metric(model, connections.open)
    yield open_now
    closed = CounterMetricFamily("temper_http_connections_closed", "HTTP connections the server closed: "
                                 "headers or body not received in time, the longest idle one evicted at the "
                                 "connection limit, or refused (503) there", labels=[*LABELS, "reason"])
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
    """The registry /metrics renders: the serving collector and the process collector."""

    def __init__(self, runtime: Runtime, connections: ConnectionCounts, refused: Callable[[], int]) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(ServingCollector(runtime, connections, refused))
        ProcessCollector(registry=self.registry)

    def render(self, accept: str) -> tuple[bytes, str]:
        """The body and its content type: OpenMetrics when `accept` (the Accept header) asks for it."""
        encoder, content_type = choose_encoder(accept)
        return encoder(self.registry), content_type
