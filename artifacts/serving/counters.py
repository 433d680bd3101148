"""The Runtime's request counters: what /metrics, Triton's /stats and the gRPC service report.

Kept apart from the batcher that updates them and from the exposition that reads them, so that
readers (artifacts/serving/exposition.py, artifacts/serving/triton_extensions.py) depend on plain counters, not on
how requests are batched or served.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

# Why a request failed, as Triton's nv_inference_request_failure labels it (`reason`):
REJECTED = "REJECTED"  # turned away or dropped unrun by the queue: full, timed out waiting, or the runtime stopping
CANCELED = "CANCELED"  # its caller gave up while it was queued (a client deadline shorter than timeout_s)
BACKEND = "BACKEND"  # the model's run failed
OTHER = "OTHER"  # anything else: a bad request, one the server refused or could not write
FAILURE_REASONS = (REJECTED, CANCELED, BACKEND, OTHER)


@dataclass
class Counters:
    """Thread-safe counters read by /metrics and /stats; names mirror Triton's nv_inference_* family.

    queue_ns and the compute_*_ns are summed per request, as Triton does (a request in a batch
    of 8 adds the whole batch's compute time); executed_requests is how many requests those
    sums cover. batches[rows] = [executions, input_ns, infer_ns, output_ns] per batch size, for
    Triton's batch_stats. failures counts failed requests by reason (FAILURE_REASONS; their sum is
    request_failure). latency_counts[i] counts successful requests with latency <=
    latency_buckets_ms[i] (cumulative, Prometheus style); latency_count is the +Inf bucket.
    Updating them costs a lock and a few additions per request; /metrics reads them at scrape time.
    """

    request_success: int = 0
    request_failure: int = 0
    success_ns: int = 0  # summed submit-to-answer time of successful requests
    failure_ns: int = 0  # summed submit-to-failure time of failed requests (0 for refused ones)
    inference_count: int = 0
    execution_count: int = 0
    executed_requests: int = 0
    queue_ns: int = 0
    compute_input_ns: int = 0  # merging (and padding) requests into one batch
    compute_ns: int = 0  # the engine's run
    compute_output_ns: int = 0  # splitting the batch's outputs back into requests
    inline_count: int = 0  # executions run on the submitting thread, not the batcher
    last_inference_ms: int = 0  # wall-clock time of the last execution, ms since the epoch (0: none yet)
    batches: dict[int, list[int]] = field(default_factory=dict)
    latency_buckets_ms: tuple[float, ...] = (1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000)
    latency_counts: list[int] = field(default_factory=list)
    latency_sum_ms: float = 0.0
    latency_count: int = 0
    failures: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FAILURE_REASONS, 0))
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.latency_counts = [0] * len(self.latency_buckets_ms)

    def record_execution(self, rows: int, requests: int, queue_ns: int, compute_ns: int,
                         input_ns: int = 0, output_ns: int = 0) -> None:
        """One batch of `rows` rows from `requests` requests; the times are the batch's own."""
        with self._lock:
            self.execution_count += 1
            self.inference_count += rows
            self.executed_requests += requests
            self.queue_ns += queue_ns
            self.compute_input_ns += input_ns * requests
            self.compute_ns += compute_ns * requests
            self.compute_output_ns += output_ns * requests
            self.last_inference_ms = time.time_ns() // 1_000_000
            per_size = self.batches.setdefault(rows, [0, 0, 0, 0])
            per_size[0] += 1
            per_size[1] += input_ns
            per_size[2] += compute_ns
            per_size[3] += output_ns

    def record_rows(self, rows: int) -> None:
        """Rows a request answered without an execution of its own (an ensemble's: its steps executed)."""
        with self._lock:
            self.inference_count += rows

    def record_inline(self) -> None:
        """One execution ran on the submitting thread instead of the batcher."""
        with self._lock:
            self.inline_count += 1

    def record_success(self, latency_ns: int) -> None:
        """One request answered `latency_ns` after it was submitted."""
        ms = latency_ns / 1e6
        with self._lock:
            self.request_success += 1
            self.success_ns += latency_ns
            self.latency_sum_ms += ms
            self.latency_count += 1
            for i, bound in enumerate(self.latency_buckets_ms):
                if ms <= bound:
                    self.latency_counts[i] += 1

    def record_failure(self, reason: str, requests: int = 1, duration_ns: int = 0) -> None:
        """`requests` failed requests, for `reason` (FAILURE_REASONS), that took `duration_ns` between them."""
        with self._lock:
            self.request_failure += requests
            self.failures[reason] += requests
            self.failure_ns += duration_ns

    def snapshot(self) -> dict:
        """A consistent copy of every counter (taken under the lock)."""
        with self._lock:
            return {
                "request_success": self.request_success,
                "request_failure": self.request_failure,
                "failures": dict(self.failures),
                "success_ns": self.success_ns,
                "failure_ns": self.failure_ns,
                "inference_count": self.inference_count,
                "execution_count": self.execution_count,
                "executed_requests": self.executed_requests,
                "queue_ns": self.queue_ns,
                "compute_input_ns": self.compute_input_ns,
                "compute_ns": self.compute_ns,
                "compute_output_ns": self.compute_output_ns,
                "inline_count": self.inline_count,
                "last_inference_ms": self.last_inference_ms,
                "batches": {rows: list(times) for rows, times in sorted(self.batches.items())},
                "latency_buckets_ms": self.latency_buckets_ms,
                "latency_counts": list(self.latency_counts),
                "latency_sum_ms": self.latency_sum_ms,
                "latency_count": self.latency_count,
            }
