"""The dynamic batcher: a bounded queue of validated requests and one thread that runs them in batches.

It knows nothing of the engine: the Runtime hands it a function that runs one batch of inputs,
so batching can be read (and changed) without session or provider details in the way.

Batching rule (measured with benchmarks/serving.py): when the engine becomes free it
takes what is already queued, up to max_batch_size rows. It waits for more (until
max_delay_ms after the batch's first request arrived) only while the batch holds fewer
requests than the previous batch did, i.e. only when recent traffic showed concurrent
clients. A lone sequential client therefore never pays the delay, and 2 closed-loop
clients are not held back waiting for a 16-row batch that will never fill.

Rows are joined along each input's own batch axis (runtime.json `batch_axis`: Silero VAD's state
[2, batch, 128] on axis 1) and split along each output's. An input without one (a sample rate, a
constant) is not batched: requests share a batch only when they send the same value.

A model whose answer to a row depends on the rows batched with it (runtime.json `batch_dependent`: the gates
found it, e.g. dynamic INT8's one activation scale per batch) runs each request in a batch of its own: one
client's data must not move another client's answer. Such a batch never waits to fill.

Tiny models skip the batcher when it is idle: a request that finds nothing queued and nothing
running is run on the caller's thread (submit(inline=True)), saving the two thread hand-offs
(batcher wake-up, answer back) that cost more than the run itself.

Deadlines: each request carries one (arrival + timeout_s, or the request's own queue timeout). One
that passes it while queued, or while its batch waits to fill, is dropped before it is computed and
answered RequestTimeout ("Request timeout expired", Triton's words), a REJECTED failure. A caller
that stops waiting calls abandon(): a queued request is then skipped, a running one is still
computed but counted a failure (CANCELED, or REJECTED once its deadline passed), never a success
its caller did not get.

Instances: with several engine instances (worker processes, artifacts/serving/workers.py) the batcher runs
one thread per instance, so that as many batches run at once. One thread at a time forms a batch
(takes what is queued and waits for more by the rule above); while it waits no other thread takes
requests, so no later request overtakes the batch being formed. An inline run holds one instance.

Lifecycle: requests submitted before start() wait in the queue and are served once it runs;
stop() fails those still queued, and every submit() after it, with Stopped, so that no caller
waits on a queue nothing drains any more. start() after stop() serves again.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from temper.artifacts.core import layout
from temper.artifacts.core.errors import InstanceLost, Overloaded, RequestError, RequestTimeout, Stopped
from temper.artifacts.formats.bundle import ServingConfig
from temper.artifacts.serving.counters import BACKEND, CANCELED, REJECTED, Counters

log = logging.getLogger("temper.serving")

Arrays = dict[str, np.ndarray]
EXPIRED = "Request timeout expired: it waited in the queue past its timeout; retry, or raise timeout_s"


@dataclass
class _Request:
    inputs: Arrays
    rows: int
    length: int | None  # axis-1 length of the padded inputs, None when the config pads nothing
    key: tuple  # shapes that must match for requests to share a batch
    future: concurrent.futures.Future
    arrived_ns: int = field(default_factory=time.perf_counter_ns)
    deadline_ns: int = 0  # perf_counter_ns after which it is not computed any more

    def reason(self, now_ns: int) -> str:
        """Why a request its caller gave up on failed: its deadline passed (REJECTED) or the caller left first."""
        return REJECTED if now_ns >= self.deadline_ns else CANCELED


def abandon(future: concurrent.futures.Future, message: str) -> bool:
    """The caller stops waiting for `future`: a queued request is skipped, a running one is failed with
    RequestTimeout(message) so that the batcher counts it a failure. False when it finished meanwhile
    (its result is there to use)."""
    if future.cancel():
        return True
    try:
        future.set_exception(RequestTimeout(message))
    except concurrent.futures.InvalidStateError:
        return False
    return True


def pad_length(inputs: Arrays, pad: dict[str, int | float]) -> int | None:
    """The axis-1 length the `pad` inputs share (RequestError when they disagree), None without any."""
    lengths = {inputs[name].shape[1] for name in pad}
    if len(lengths) > 1:
        raise RequestError(f"padded inputs {sorted(pad)} disagree on axis-1 length: {sorted(lengths)}")
    return lengths.pop() if lengths else None


class Batcher:
    """Queues requests and runs them in batches on one thread per engine instance, or inline when idle.

    `run` executes one batch (named inputs to named outputs); it is called on at most `instances`
    threads at a time, the batcher's or an inline caller's. `counters` receives every execution,
    success and failure from the queue onwards.
    """

    def __init__(self, config: ServingConfig, max_rows: int, run: Callable[[Arrays], Arrays],
                 counters: Counters, instances: int = 1) -> None:
        self.config = config
        self.max_rows = max_rows
        self.counters = counters
        self._run = run
        self._inputs = [spec.name for spec in config.inputs]
        self._layout = config.layout()
        self._dynamic_axis1 = {s.name for s in config.outputs
                               if s.batch_axis == 0 and len(s.shape) > 1 and s.shape[1] == -1}
        self._queue: deque[_Request] = deque()
        self._cond = threading.Condition()
        self.instances = instances  # batches that may run at once (set before start)
        self._threads: list[threading.Thread] = []
        self._running = False
        self._stopped = False  # stop() ran and start() did not follow: submit() refuses; guarded by _cond
        self._busy = 0  # batches forming or executing, and inline runs; guarded by _cond
        self._forming = False  # a thread is taking requests into a batch; guarded by _cond
        self._last_batch_requests = 0
        self._alone = config.batch_dependent  # one request per batch (see the module docstring)

    @property
    def started(self) -> bool:
        """Whether the batching threads run (start() called, stop() not since)."""
        return bool(self._threads)

    @property
    def pending(self) -> int:
        """Requests queued and not yet taken into a batch (Triton's pending request count)."""
        return len(self._queue)

    def start(self, name: str) -> None:
        """Start the batching threads, named after the model, which serve what is queued already."""
        with self._cond:
            self._running, self._stopped = True, False
        self._threads = [threading.Thread(target=self._serve, name=f"temper-batcher-{name}-{i}", daemon=True)
                         for i in range(self.instances)]
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        """Stop the batching thread; requests still queued, and later submits, fail with Stopped."""
        with self._cond:
            self._running = False
            self._stopped = True
            pending = list(self._queue)
            self._queue.clear()
            self._cond.notify_all()
        for thread in self._threads:
            thread.join()
        self._threads = []
        for request in pending:
            if request.future.set_running_or_notify_cancel():
                request.future.set_exception(Stopped("runtime stopped"))
        now = time.perf_counter_ns()
        self.counters.record_failure(REJECTED, len(pending), sum(now - r.arrived_ns for r in pending))

    def submit(self, inputs: Arrays, rows: int, inline: bool,
               timeout_s: float | None = None) -> concurrent.futures.Future:
        """Queue a validated request of `rows` rows (Overloaded when full, Stopped once stopped);
        with `inline`, run it on this thread instead when nothing is queued or running. It is dropped
        unrun once queued longer than `timeout_s` (default: config.timeout_s)."""
        length = pad_length(inputs, self.config.pad)
        request = _Request(dict(inputs), rows, length, self._key(inputs), concurrent.futures.Future())
        wait_s = self.config.timeout_s if timeout_s is None else timeout_s
        request.deadline_ns = request.arrived_ns + int(wait_s * 1e9)
        with self._cond:
            if self._stopped:
                self.counters.record_failure(REJECTED)
                raise Stopped("runtime stopped: it takes no more requests")
            run_here = inline and self._idle()
            if run_here:
                self._busy += 1
                self._last_batch_requests = 1
            else:
                if len(self._queue) >= self.config.max_queue:
                    self.counters.record_failure(REJECTED)
                    raise Overloaded(f"Exceeds maximum queue size: queue full ({self.config.max_queue} requests "
                                     "waiting); retry later")
                self._queue.append(request)
                self._cond.notify_all()  # the forming thread, or an idle one
        if run_here:
            self._run_inline(request)
        return request.future

    def _key(self, inputs: Arrays) -> tuple:
        """What requests must share to join one batch: every dim but the batch axis (and the padded axis 1)
        of the batched inputs, and the very value of the unbatched ones."""
        key: list[object] = []
        for name in self._inputs:
            array, axis = inputs[name], self._layout.inputs.get(name, 0)
            if axis is None:
                key.append((array.dtype.str, array.shape, array.tobytes()))
            else:
                key.append(tuple(d for i, d in enumerate(array.shape)
                                 if i != axis and not (i == 1 and name in self.config.pad)))
        return tuple(key)

    def _idle(self) -> bool:
        """Whether a request may run inline: serving, nothing queued or forming, an instance free. Called with the
        lock held."""
        return self._running and self._busy < self.instances and not self._forming and not self._queue

    def _run_inline(self, request: _Request) -> None:
        """Execute one request as a batch of one on this thread; _busy is already set."""
        try:
            self.counters.record_inline()
            request.future.set_running_or_notify_cancel()
            self._execute([request])
        finally:
            self._release()

    def _release(self) -> None:
        """An instance is free again: wake the batcher for requests queued meanwhile."""
        with self._cond:
            self._busy -= 1
            if self._queue:
                self._cond.notify_all()

    # -- batching thread --------------------------------------------------------------------

    def _serve(self) -> None:
        while (batch := self._next_batch()) is not None:
            if batch := self._unexpired(batch):
                self._execute(batch)
            self._release()

    def _unexpired(self, batch: list[_Request]) -> list[_Request]:
        """The batch without requests whose deadline passed while it waited to fill, or whose caller gave up."""
        now = time.perf_counter_ns()
        kept = []
        for request in batch:
            if request.future.done():  # abandoned by its caller
                self.counters.record_failure(request.reason(now), 1, now - request.arrived_ns)
            elif now >= request.deadline_ns:
                request.future.set_exception(RequestTimeout(EXPIRED))
                self.counters.record_failure(REJECTED, 1, now - request.arrived_ns)
            else:
                kept.append(request)
        return kept

    def _next_batch(self) -> list[_Request] | None:
        """Block until work arrives, no other thread is forming a batch and an instance is free; None once
        stopped. See the module docstring for the rule. The batch returned (empty too) holds an instance
        until _release()."""
        with self._cond:
            while self._running and (self._forming or self._busy >= self.instances or not self._queue):
                self._cond.wait()
            if not self._running:
                return None
            self._busy += 1
            batch: list[_Request] = []
            self._take(batch)
            if batch:
                self._forming = True  # from now on, while it waits to fill: no request overtakes it
                deadline = batch[0].arrived_ns + int(self.config.max_delay_ms * 1e6)
                while (
                    self._running
                    and not self._alone
                    and len(batch) < self._last_batch_requests
                    and sum(r.rows for r in batch) < self.max_rows
                    and (remaining := deadline - time.perf_counter_ns()) > 0
                ):
                    self._cond.wait(remaining / 1e9)
                    self._take(batch)
                self._last_batch_requests = len(batch)
                self._forming = False
                self._cond.notify_all()  # the next thread may form a batch of what is left
            return batch

    def _take(self, batch: list[_Request]) -> None:
        """Move queued requests that fit (rows, shapes) into `batch`, in arrival order,
        dropping cancelled and expired ones. Called with the lock held."""
        rows = sum(r.rows for r in batch)
        now = time.perf_counter_ns()
        kept: deque[_Request] = deque()
        while self._queue:
            request = self._queue.popleft()
            if now >= request.deadline_ns:  # timed out waiting, whether or not its caller has given up on it
                if request.future.set_running_or_notify_cancel():
                    request.future.set_exception(RequestTimeout(EXPIRED))
                self.counters.record_failure(REJECTED, 1, now - request.arrived_ns)
            elif rows + request.rows > self.max_rows or (batch and (self._alone or request.key != batch[0].key)):
                kept.append(request)
            elif request.future.set_running_or_notify_cancel():
                batch.append(request)
                rows += request.rows
            else:  # its caller gave up first
                self.counters.record_failure(request.reason(now), 1, now - request.arrived_ns)
        self._queue = kept

    def _execute(self, batch: list[_Request]) -> None:
        """Run one batch and hand each request its own rows; a failure fails only this batch."""
        started = time.perf_counter_ns()
        try:
            merged = self._merge(batch)
            merged_ns = time.perf_counter_ns()
            outputs = self._run(merged)
            computed = time.perf_counter_ns()
            results = self._split(batch, outputs)
        except Exception as exc:
            if isinstance(exc, Stopped):  # its worker died (the pool logged it), or none is left
                log.warning("%s: batch of %d requests failed: %s", self.config.name, len(batch), exc)
            else:
                log.exception("%s: batch of %d requests failed", self.config.name, len(batch))
            for request in batch:
                with contextlib.suppress(concurrent.futures.InvalidStateError):  # abandoned meanwhile
                    request.future.set_exception(exc)
            failed = time.perf_counter_ns()
            reason = REJECTED if isinstance(exc, Stopped) and not isinstance(exc, InstanceLost) else BACKEND
            self.counters.record_failure(reason, len(batch), sum(failed - r.arrived_ns for r in batch))
            return
        done = time.perf_counter_ns()
        queued = sum(started - r.arrived_ns for r in batch)
        self.counters.record_execution(sum(r.rows for r in batch), len(batch), queued, computed - merged_ns,
                                      merged_ns - started, done - computed)
        for request, result in zip(batch, results):
            try:
                request.future.set_result(result)
            except concurrent.futures.InvalidStateError:  # its caller gave up while it ran: not a success
                self.counters.record_failure(request.reason(done), 1, done - request.arrived_ns)
            else:
                self.counters.record_success(done - request.arrived_ns)

    def _merge(self, batch: list[_Request]) -> Arrays:
        """Join the batch's rows along each input's batch axis, padding config.pad inputs on axis 1 to the longest."""
        if len(batch) == 1:
            return batch[0].inputs
        longest = max(r.length or 0 for r in batch)
        parts = [{name: _pad_axis1(r.inputs[name], longest, self.config.pad[name]) if name in self.config.pad
                  else r.inputs[name] for name in self._inputs} for r in batch]
        return self._layout.join(parts)

    def _split(self, batch: list[_Request], outputs: Arrays) -> list[Arrays]:
        """Each request's rows of every output, along its batch axis; padded-length outputs sliced back to the
        request's own length."""
        total = sum(r.rows for r in batch)
        axes = self._layout.outputs
        for name, array in outputs.items():
            axis = axes.get(name, 0)
            if axis is not None and (array.ndim <= axis or array.shape[axis] != total):
                raise RuntimeError(f"output {name!r} has shape {list(array.shape)}: "
                                   f"not {total} rows on its batch axis {axis}")
        longest = max(r.length or 0 for r in batch)
        results = layout.split(outputs, axes, [r.rows for r in batch])
        for request, own in zip(batch, results):
            for name, array in own.items():
                if request.length is not None and name in self._dynamic_axis1 and array.shape[1] == longest:
                    own[name] = array[:, : request.length]
        return results


def _pad_axis1(array: np.ndarray, length: int, value: int | float) -> np.ndarray:
    if array.shape[1] == length:
        return array
    widths = [(0, 0), (0, length - array.shape[1])] + [(0, 0)] * (array.ndim - 2)
    return np.pad(array, widths, constant_values=value)
