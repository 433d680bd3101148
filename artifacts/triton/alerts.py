"""The alerting rules and the autoscaler `temper export-triton` writes beside a model's Deployment when its bundle
carries a capacity measurement (capacity.json, `temper capacity`): every threshold comes from that measurement,
none is a default guessed for all models.

    prometheusrule.yaml   a PrometheusRule (monitoring.coreos.com/v1, the Prometheus Operator's) with one alert per
                          signal of the design: throughput (per replica within 5% of the measured capacity, and 5%
                          under it while queued past the knee), latency (Triton's p99 over 80% of the target),
                          memory (the pod's working set over 90% of its request) and errors (over 1% of requests)
    hpa.yaml              a HorizontalPodAutoscaler (autoscaling/v2) on the requests queued per replica
                          (nv_inference_pending_request_count, through prometheus-adapter) with the queue measured
                          at the knee as its target, and on memory at 90% of the request

Why an HPA rather than KEDA's ScaledObject: it is core Kubernetes (nothing to install beyond a custom-metrics
adapter, which Triton's own Helm chart uses the same way), and the pending-request gauge Triton and temper serve
both export is per pod already, so prometheus-adapter's default rules expose it with no query to write.
"""

from __future__ import annotations

import math

from temper.artifacts.formats.capacity import Capacity

MEMORY_HEADROOM = 1.25  # the pod's memory request over the memory measured at the knee (80% used at the knee)
MEMORY_SCALE_PCT = 90  # the design: scale out above 90% memory utilization
LATENCY_SHARE = 0.8  # the design: p99 at most 80% of the SLA
THROUGHPUT_CHANGE = 0.05  # the design: alert on a 5% change
ERROR_RATIO = 0.01  # a policy, not a measurement: the knee was measured with no error at all
MAX_REPLICAS = 4
FOR = "5m"
MIB = 2**20


def memory_request(capacity: Capacity | None) -> int | None:
    """The pod's memory request in MiB: the memory measured at the knee with 25% headroom; None when not measured."""
    if capacity is None or capacity.memory_bytes is None:
        return None
    return math.ceil(capacity.memory_bytes * MEMORY_HEADROOM / MIB)


def _quantity(value: float) -> str:
    """A Kubernetes quantity in thousandths (at least 1m): 0.25 -> 250m."""
    return f"{max(1, math.ceil(value * 1000))}m"


def rules(model: str, name: str, capacity: Capacity) -> dict:
    """The PrometheusRule of the four signals, for Triton's metrics of `model` (`name`: its Kubernetes name)."""
    selector = f'model="{model}"'
    per_replica = (f"sum(rate(nv_inference_request_success{{{selector}}}[5m])) / "
                   f"count(nv_inference_pending_request_count{{{selector}}})")
    queue_us = (f"sum(rate(nv_inference_queue_duration_us{{{selector}}}[5m])) / "
                f"sum(rate(nv_inference_request_success{{{selector}}}[5m]))")
    failures = f"sum(rate(nv_inference_request_failure{{{selector}}}[5m]))"
    answered = f"sum(rate(nv_inference_request_success{{{selector}}}[5m]))"
    rate, target = capacity.rate, capacity.target_p99_ms
    near = round(rate * (1 - THROUGHPUT_CHANGE), 3)
    knee_queue = capacity.queue_us or 0.0
    alerts = [
        _alert("TritonThroughputNearCapacity", f"{per_replica} > {near}",
               f"{model}: each replica serves over {near:g} requests/s, within 5% of the {rate:g} measured with p99 "
               f"under {target:g} ms: add replicas before p99 passes the target"),
        _alert("TritonThroughputUnderCapacity", f"({per_replica} < {near}) and ({queue_us} > {round(knee_queue, 1)})",
               f"{model}: requests queue longer than at the measured knee ({knee_queue:.0f} us) while each replica "
               f"serves 5% less than its measured {rate:g} requests/s: the pods serve less than they were measured to"),
        _alert("TritonLatencyP99", f'max(nv_inference_request_summary_us{{{selector},quantile="0.99"}}) > '
                                   f"{round(target * LATENCY_SHARE * 1000, 1)}",
               f"{model}: p99 over {LATENCY_SHARE:.0%} of the {target:g} ms target (Triton's server-side summary)"),
        _alert("TritonErrorRate", f"{failures} / ({answered} + {failures}) > {ERROR_RATIO}",
               f"{model}: over {ERROR_RATIO:.0%} of requests fail (none failed at the measured knee)"),
    ]
    request = memory_request(capacity)
    if request is not None:
        alerts.append(_alert(
            "TritonMemoryHigh", f'max(container_memory_working_set_bytes{{container="tritonserver",pod=~"{name}-.*"}}) '
                                f"/ {request * MIB} > {MEMORY_SCALE_PCT / 100}",
            f"{model}: a pod uses over {MEMORY_SCALE_PCT}% of its {request} MiB memory request (sized from the "
            f"{(capacity.memory_bytes or 0) / MIB:.0f} MiB measured at the knee)"))
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/instance": name,
                                              "app.kubernetes.io/managed-by": "temper"}},
        "spec": {"groups": [{"name": f"{name}.capacity", "rules": alerts}]},
    }


def _alert(alert: str, expr: str, summary: str) -> dict:
    return {"alert": alert, "expr": expr, "for": FOR, "labels": {"severity": "warning"},
            "annotations": {"summary": summary}}


def autoscaler(model: str, name: str, capacity: Capacity) -> dict:
    """The HorizontalPodAutoscaler of the Deployment `name`: requests queued per replica at the knee, and memory."""
    metrics: list[dict] = [{
        "type": "Pods",
        "pods": {"metric": {"name": "nv_inference_pending_request_count",
                            "selector": {"matchLabels": {"model": model}}},
                 "target": {"type": "AverageValue", "averageValue": _quantity(capacity.queued)}},
    }]
    if memory_request(capacity) is not None:  # utilization is relative to the request, which needs a measurement
        metrics.append({"type": "Resource", "resource": {
            "name": "memory", "target": {"type": "Utilization", "averageUtilization": MEMORY_SCALE_PCT}}})
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/instance": name,
                                              "app.kubernetes.io/managed-by": "temper"}},
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
                 "minReplicas": 1, "maxReplicas": MAX_REPLICAS, "metrics": metrics},
    }
