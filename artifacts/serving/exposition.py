"""`/metrics`: the runtime's and the HTTP server's counters as Prometheus metrics, read at scrape time.

One Runtime.metrics snapshot per scrape becomes metric families, so serving a request costs
nothing beyond the Runtime's own counters. The answer is Prometheus's text format 0.0.4, whatever
the Accept header asks, as Triton answers.

Triton's families keep Triton's names, types and labels, so its Grafana dashboards and autoscaling
rules work unchanged: the nv_inference_* counts and cumulative durations are counters without a
`_total` suffix, nv_inference_request_failure has a `reason` label (REJECTED, CANCELED, BACKEND,
OTHER: artifacts/serving/counters.py says which failure is which), and the pending requests and the
host's memory are gauges. They are written here: prometheus_client's text encoder names every
counter `<name>_total` on its TYPE line, and OpenMetrics requires that suffix on counter samples,
so under Triton's names it could only type them `untyped`. temper's own families (latency and
batch-size histograms, start-up choices, HTTP connections) and the process collector (RSS, CPU
seconds, open file descriptors) go through prometheus_client.

The exposition reads the models loaded (artifacts/serving/models.py: each one's Runtime, version, memory and the
requests the server refused before it) and the connection counts, never the server itself, so the server
depends on it and not the other way round. Every per-model family has one series per model loaded, labelled
with its name and the version it serves.
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

from temper.artifacts.engines import gpu_memory
from temper.artifacts.engines.providers import PROVIDERS
from temper.artifacts.serving.counters import FAILURE_REASONS, OTHER
from temper.artifacts.serving.models import LOAD_GROWTH, WORKERS_RSS, Loaded, Models
from temper.artifacts.serving.runtime import Runtime

LABELS = ["model", "version"]
CLOSE_REASONS = ("header_timeout", "body_timeout", "headers_too_large", "evicted", "refused")


class ConnectionCounts(Protocol):
    """What /metrics reads of the HTTP connections (artifacts.serving.http_limits.Connections)."""

    open: int  # connections open now
    closed: Counter[str]  # connections the server closed, by reason (CLOSE_REASONS)


# Triton's per-model counters and gauges: (name, type, help, value from a snapshot, the Loaded model)
PER_MODEL: list[tuple[str, str, str, Callable[[dict, Loaded], float]]] = [
    ("nv_inference_request_success", "counter", "Number of successful inference requests",
     lambda m, _: m["request_success"]),
    ("nv_inference_count", "counter", "Number of inferences performed (a batch of n rows counts n)",
     lambda m, _: m["inference_count"]),
    ("nv_inference_exec_count", "counter", "Number of model executions (batches) performed",
     lambda m, _: m["execution_count"]),
    ("nv_inference_request_duration_us", "counter", "Cumulative time from submission to answer or failure of "
     "inference requests, in microseconds", lambda m, _: (m["success_ns"] + m["failure_ns"]) // 1000),
    ("nv_inference_queue_duration_us", "counter", "Cumulative time requests waited in the queue, in microseconds",
     lambda m, _: m["queue_ns"] // 1000),
    ("nv_inference_compute_input_duration_us", "counter", "Cumulative time merging requests into batches, per "
     "request, in microseconds", lambda m, _: m["compute_input_ns"] // 1000),
    ("nv_inference_compute_infer_duration_us", "counter", "Cumulative model execution time per request, in "
     "microseconds", lambda m, _: m["compute_ns"] // 1000),
    ("nv_inference_compute_output_duration_us", "counter", "Cumulative time splitting batch outputs into requests, "
     "per request, in microseconds", lambda m, _: m["compute_output_ns"] // 1000),
    ("nv_inference_pending_request_count", "gauge", "Inference requests queued, waiting for a batch",
     lambda _, model: model.runtime.pending),
    ("temper_inline_exec_count", "counter", "Executions run inline on the event loop instead of by the batcher",
     lambda m, _: m["inline_count"]),
]


def _triton_families(models: list[Loaded]) -> list[Metric]:
    """Triton's per-model counters and gauges, one sample per model loaded, and its host memory gauges. The
    requests each model's server refused before its runtime (which counts everything after that point) are
    failures of reason OTHER."""
    snapshots = [(model, model.runtime.metrics.snapshot(), _labels(model)) for model in models]
    families = []
    for name, kind, help_text, value in PER_MODEL:
        family = Metric(name, help_text, kind)
        for model, m, labels in snapshots:
            family.add_sample(name, labels, value(m, model))
        families.append(family)
    failures = Metric("nv_inference_request_failure", "Number of failed inference requests, by reason: REJECTED "
                      "(queue full, timed out in the queue, runtime stopping), CANCELED (the caller gave up), "
                      "BACKEND (the model's run failed), OTHER (bad or refused requests)", "counter")
    for model, m, labels in snapshots:
        for reason in FAILURE_REASONS:
            count = m["failures"][reason] + (model.refused if reason == OTHER else 0)
            failures.add_sample(failures.name, {**labels, "reason": reason}, count)
    families.insert(1, failures)
    memory = psutil.virtual_memory()
    for gauge, about, amount in (
            ("nv_cpu_memory_total_bytes", "Total memory of the host, in bytes", memory.total),
            ("nv_cpu_memory_used_bytes", "Memory in use on the host (total less available), in bytes",
             memory.total - memory.available)):
        host = Metric(gauge, about, "gauge")
        host.add_sample(gauge, {}, amount)
        families.append(host)
    if any(isinstance(m.runtime, Runtime) and PROVIDERS[m.runtime.provider].gpu for m in models):  # Triton's GPU gauges
        families += _gpu_families()
    return families


def _gpu_families() -> list[Metric]:
    """Triton's nv_gpu_memory_total_bytes and nv_gpu_memory_used_bytes, one sample per GPU the driver lists."""
    families = []
    gpus = gpu_memory.devices() or []
    for gauge, about, amounts in (("nv_gpu_memory_total_bytes", "GPU total memory, in bytes", [t for _, _, t in gpus]),
                                  ("nv_gpu_memory_used_bytes", "GPU used memory, in bytes", [u for _, u, _ in gpus])):
        family = Metric(gauge, about, "gauge")
        for (uuid, _, _), mib in zip(gpus, amounts):
            family.add_sample(gauge, {"gpu_uuid": uuid}, mib * 2**20)
        families.append(family)
    return families


def _labels(model: Loaded) -> dict[str, str]:
    return dict(zip(LABELS, [model.name, model.version]))


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
    """temper's own metric families from the models and the connection counts, built at each scrape."""

    def __init__(self, models: Models, connections: ConnectionCounts) -> None:
        self.models = models
        self.connections = connections

    def collect(self) -> Iterator[Metric]:
        loaded = self.models.all()
        yield from _runtime_families(loaded)
        yield from _connection_families(self.connections, self.models.only())


def _runtime_families(models: list[Loaded]) -> Iterator[Metric]:
    """Start-up choices, latency, batch sizes, memory and instances, one sample (or series) per model."""
    info = GaugeMetricFamily("temper_runtime_info", "What start-up chose: engine, intra-op threads, inline runs, "
                             "worker instances (0: in the server's process), one request per batch (a batch-dependent "
                             "model) (value 1)",
                             labels=[*LABELS, "engine", "intra_op_threads", "inline", "instances", "batch_alone"])
    latency = HistogramMetricFamily("temper_request_duration_seconds", "Time from queueing to answer of "
                                    "successful inference requests", labels=LABELS)
    sizes = HistogramMetricFamily("temper_batch_size", "Rows per model execution", labels=LABELS)
    memory = GaugeMetricFamily("temper_model_memory_bytes", "Memory the model takes, as `measure` says: "
                               f"{WORKERS_RSS} (its worker processes' RSS now) or {LOAD_GROWTH} (the server "
                               "process's RSS growth across its load: in-process sessions cannot be told apart)",
                               labels=[*LABELS, "measure"])
    gpu = GaugeMetricFamily("temper_model_gpu_memory_bytes", "GPU memory the model's processes hold, as the NVIDIA "
                            "driver reports it (a model on a GPU engine; the memory signal to alert on)", labels=LABELS)
    for loaded in models:
        runtime, model = loaded.runtime, [loaded.name, loaded.version]
        m = runtime.metrics.snapshot()
        if isinstance(runtime, Runtime):  # an ensemble runs no engine and no batch: its composing models' say theirs
            info.add_metric([*model, runtime.provider, str(runtime.intra_op_threads), str(runtime.inline).lower(),
                             str(runtime.instances or 0), str(runtime.config.batch_dependent).lower()], 1)
            _batch_sizes(sizes, m["batches"], runtime.max_rows, model, m["inference_count"])
        buckets = [(floatToGoString(ms / 1000), n) for ms, n in zip(m["latency_buckets_ms"], m["latency_counts"])]
        latency.add_metric(model, [*buckets, ("+Inf", m["latency_count"])], m["latency_sum_ms"] / 1000)
        size, measure = loaded.memory()
        memory.add_metric([*model, measure], size)
        if (held := loaded.gpu_memory()) is not None:
            gpu.add_metric(model, held)
    yield from (info, latency, sizes, memory, gpu)
    yield from _instance_families(models)
    yield from _fallback_families(models)


def _fallback_families(models: list[Loaded]) -> Iterator[Metric]:
    """The burst fallback (artifacts/serving/fallback.py) of each model that has one on."""
    served = CounterMetricFamily("temper_fallback_requests", "Requests sent to each model of a burst fallback "
                                 "(served_by: primary, backup)", labels=[*LABELS, "served_by"])
    switches = CounterMetricFamily("temper_fallback_switches", "Burst fallback switches: to the backup (cause "
                                   "queue_time: the primary's estimated latency over the target) and back to the "
                                   "primary (cause recovered)", labels=[*LABELS, "to", "cause"])
    active = GaugeMetricFamily("temper_fallback_active", "1 while requests go to the backup model", labels=LABELS)
    target = GaugeMetricFamily("temper_fallback_latency_target_seconds", "The latency target the fallback keeps",
                               labels=LABELS)
    for loaded in models:
        fallback, model = loaded.runtime.fallback, [loaded.name, loaded.version]
        if fallback is None:
            continue
        for which, count in fallback.served.items():
            served.add_metric([*model, which], count)
        for (to, cause), count in fallback.switches.items():
            switches.add_metric([*model, to, cause], count)
        active.add_metric(model, int(fallback.active))
        target.add_metric(model, fallback.target_ms / 1000)
    yield from (served, switches, active, target)


def _instance_families(models: list[Loaded]) -> Iterator[Metric]:
    """Per model instance (worker process; the one in-process session with --instances 0): whether it is
    ready, and how often its worker was restarted after dying. Triton has no such series; these follow its
    model and version labels."""
    ready = GaugeMetricFamily("temper_model_instance_ready", "Whether the model instance (worker process) is "
                              "started, warmed up and alive (1) or not (0: starting, restarting, taken out)",
                              labels=[*LABELS, "instance"])
    restarts = CounterMetricFamily("temper_model_instance_restarts", "Times the instance's worker process was "
                                   "started again after it died", labels=[*LABELS, "instance"])
    for loaded in models:
        runtime, model, pool = loaded.runtime, [loaded.name, loaded.version], loaded.runtime.pool
        if pool is None:
            ready.add_metric([*model, "0"], float(runtime.ready))
            restarts.add_metric([*model, "0"], 0)
            continue
        for instance in pool.instances:
            ready.add_metric([*model, str(instance.index)], float(instance.ready))
            restarts.add_metric([*model, str(instance.index)], instance.restarts)
    yield ready
    yield restarts


def _connection_families(connections: ConnectionCounts, only: Loaded | None) -> Iterator[Metric]:
    """Open HTTP connections, and those the server closed by reason: the server's, labelled with its model
    when it serves one (as before repositories), else with empty model and version labels."""
    model = [only.name, only.version] if only is not None else ["", ""]
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


def _batch_sizes(family: HistogramMetricFamily, batches: dict[int, list[int]], max_rows: int, model: list[str],
                 rows: int) -> None:
    """Executions by batch size (rows), in power-of-two buckets up to max_rows; the sum is the rows run."""
    bounds = sorted({min(1 << i, max_rows) for i in range(max_rows.bit_length() + 1)})
    buckets = [(floatToGoString(b), sum(v[0] for size, v in batches.items() if size <= b)) for b in bounds]
    family.add_metric(model, [*buckets, ("+Inf", sum(v[0] for v in batches.values()))], rows)


class Exposition:
    """What /metrics renders: Triton's families, then temper's and the process collector's."""

    def __init__(self, models: Models, connections: ConnectionCounts) -> None:
        self.models = models
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(ServingCollector(models, connections))
        ProcessCollector(registry=self.registry)

    def render(self) -> tuple[bytes, str]:
        """The body and its content type, the text format 0.0.4."""
        triton = _text(_triton_families(self.models.all())).encode()
        return triton + generate_latest(self.registry), CONTENT_TYPE_PLAIN_0_0_4
