"""Burst fallback: a second gated model that takes requests while the primary's queue would break the latency target.

A bundle may carry a backup model in its `backup/` folder (itself a bundle: a candidate that passed the same
gates; for a run's output folder, the fastest passing pair on the selected engine other than the selected one,
pipeline/outputs.py backup_of). With `temper serve --burst-fallback-ms TARGET` (off by default) every request
asks `choose()`: the primary's expected latency is the larger of what it holds now (the rows sent to it and not
answered yet, queued or in the batch running, plus one, plus the rows that will join the request's batch while
it waits: the arrival rate of the last window over that wait, up to max_rows; at its mean compute time per row,
over its instances: estimate_ms) and the mean latency of its answers in the last WINDOW_S (0 when it answered
none, or no request came for two windows: traffic has moved to the backup, or paused, and its queue drained);
above TARGET the fallback switches on (cause `queue_time`) and requests go to the backup, below RECOVER x TARGET
it switches back (cause `recovered`).
The switches, their cause and the requests each model served show in /metrics (temper_fallback_*) and each
REST answer's parameters and each gRPC ModelInferResponse's (`temper_served_by`, `temper_fallback_cause`).
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from typing import TYPE_CHECKING

from temper.artifacts.formats.bundle import BACKUP

if TYPE_CHECKING:
    import numpy as np

    from temper.artifacts.serving.runtime import Runtime

log = logging.getLogger("temper.serving")

WINDOW_S = 0.05  # the primary's recent answers are averaged over windows this long
RECOVER = 0.5  # back to the primary once its estimate is under this share of the target
PRIMARY = "primary"


class BurstFallback:
    """Which model a request goes to, and the counts /metrics shows."""

    def __init__(self, primary: Runtime, backup: Runtime, target_ms: float) -> None:
        self.primary, self.backup, self.target_ms = primary, backup, target_ms
        self.active = False
        self.cause = ""
        self.served = {PRIMARY: 0, BACKUP: 0}
        self.switches: dict[tuple[str, str], int] = {(BACKUP, "queue_time"): 0, (PRIMARY, "recovered"): 0}
        self._lock = threading.Lock()
        self._window = (0.0, 0, 0, 0)  # (monotonic s, successes, their summed ns, rows arrived) at the window's start
        self._recent_ms = 0.0  # the primary's mean latency over the last window (0: it answered none)
        self._outstanding = 0  # rows sent to the primary and not answered yet: queued, or in a batch running
        self._arrived = 0  # rows of every request asked for so far, on either model
        self._rate = 0.0  # rows per second arriving over the last window

    def sent(self, future: Future, rows: int) -> None:
        """Count `rows` sent to the primary until `future` is done (answered, failed or dropped). The batcher's
        pending count alone misses the rows of the batch running: a request queued behind a batch of 16 waits for
        all 16, so switching back on the queue alone sends requests into a wait far over the target."""
        with self._lock:
            self._outstanding += rows

        def done(_: Future) -> None:
            with self._lock:
                self._outstanding -= rows

        future.add_done_callback(done)

    def estimate_ms(self) -> float:
        """The primary's expected latency for a request queued now, at its mean compute time per row so far (its
        batch-1 run before any), over its instances: the rows computed before its batch starts (the batch running,
        and the full batches queued ahead of it), then its own batch: the rows queued in it, its own, and the rows
        that will join it while it waits (the recent arrival rate over that wait, up to max_rows). Without those
        joiners, requests kept on the primary near the switching point waited for a batch that kept filling
        after them (benchmarks/burst_fallback.py: p99 over the target)."""
        runtime = self.primary
        m = runtime.metrics.snapshot()
        rows = sum(size * times[0] for size, times in m["batches"].items())
        per_row = sum(times[2] for times in m["batches"].values()) / rows / 1e6 if rows else runtime.batch1_ms or 0.0
        now = time.monotonic()
        if now - self._window[0] >= WINDOW_S:  # the primary's answers of the last window: their mean latency
            done, spent = m["request_success"] - self._window[1], m["success_ns"] - self._window[2]
            # a window left open for long (no request asked meanwhile) holds answers of long ago, not recent ones
            fresh = now - self._window[0] < 2 * WINDOW_S
            self._recent_ms = spent / done / 1e6 if done and fresh else 0.0
            self._rate = (self._arrived - self._window[3]) / (now - self._window[0]) if fresh else 0.0
            self._window = (now, m["request_success"], m["success_ns"], self._arrived)
        instances, most = max(1, runtime.instances or 0), max(1, runtime.max_rows)
        queued = runtime.pending
        full, partial = divmod(queued, most)
        before = max(0, self._outstanding - queued) + full * most  # rows computed before its batch starts
        wait_s = before * per_row / instances / 1000
        own = min(most, partial + 1 + self._rate * wait_s)
        projected = (before + own) * per_row / instances
        return max(projected, self._recent_ms)

    def choose(self) -> tuple[Runtime, str, str]:
        """(the runtime to submit to, which one it is, the cause of the current state)."""
        estimate = self.estimate_ms()
        with self._lock:
            if not self.active and estimate > self.target_ms:
                self.active, self.cause = True, "queue_time"
                self.switches[BACKUP, "queue_time"] += 1
                log.warning("%s: switching to the backup model: the primary's estimated latency %.1f ms is over the "
                            "%.1f ms target", self.primary.config.name, estimate, self.target_ms)
            elif self.active and estimate < RECOVER * self.target_ms:
                self.active, self.cause = False, "recovered"
                self.switches[PRIMARY, "recovered"] += 1
                log.warning("%s: back to the primary model: its estimated latency %.1f ms is under %.0f %% of the "
                            "target", self.primary.config.name, estimate, RECOVER * 100)
            which = BACKUP if self.active else PRIMARY
            self.served[which] += 1
            return (self.backup if self.active else self.primary), which, self.cause

    def submit(self, inputs: dict[str, np.ndarray], rows: int, inline: bool, timeout_s: float | None) -> Future:
        """Queue a validated request on the model choose() picks; the future carries which one and why (the
        answer's parameters), and the rows sent to the primary count until it is done."""
        with self._lock:
            self._arrived += rows
        runtime, which, cause = self.choose()
        future = runtime._submit(inputs, rows, inline, timeout_s)
        if which == PRIMARY:
            self.sent(future, rows)
        future.temper_parameters = {"temper_served_by": which, "temper_fallback_cause": cause}  # type: ignore
        return future
