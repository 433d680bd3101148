"""Serving a Triton ensemble: each request runs the steps of a checked EnsembleSpec (formats/ensemble.py) on the
composing models the server has loaded, each step as soon as the tensors it takes exist.

`Ensemble` stands where a Runtime stands in artifacts/serving/models.py's Loaded, so both servers, /config, /stats and
/metrics serve it as any model: it checks a request against the ensemble's inputs, then submits each step to the
composing model's own Runtime, looked up by name per request (a composing model loaded again at a newer version
serves the next request). A step's request therefore queues and batches with that model's other requests, direct
or from other ensembles, under its batching rule, queue bound and timeout, and is counted in that model's own
statistics and /metrics series: the stages' figures are the composing models', as Triton reports them. The
ensemble's own counters hold its requests (success, failure by reason, end-to-end latency) and rows; it executes
nothing itself, so its execution count, queue and compute times stay 0, as for a Triton ensemble.

Tensors between steps: a step's inputs are the arrays the previous step's Runtime answered, handed over as they
are. In the server's process (--instances 0) those are numpy views of that step's batch output (the batcher splits
a batch into per-request views), and the next step's batcher hands a request that runs alone to ONNX Runtime
as it is: no copy between stages. A request joined with others into one batch is concatenated with them, a copy
batching makes for any request. With worker processes (serving/workers.py) each stage is one round trip through
its instance's shared memory, and a boundary between two stages costs two copies of the tensor: out of stage 1's
output region (the region belongs to that instance's next batch once the answer is back, while stage 2 may still
be queued) and into stage 2's input region (the only memory stage 2's worker reads a batch from; a batch joins
several requests there). Those are the same two copies any request's answer and inputs cost: a two-stage ensemble
costs what the two calls one after the other would, less the client's own round trip.

A step that fails fails the request with that step's error (its 400, 503 or 504); a caller that gives up (its
timeout, gRPC deadline) abandons the step in flight, which its model then counts as it counts any abandoned
request. The ensemble is ready when every composing model is; it is "taken out" (artifacts/serving/models.py's liveness)
when one of them is, or is no longer loaded: loading the ensemble again loads it.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from temper.artifacts.core.errors import InstanceLost, Overloaded, RequestError, RequestTimeout, Stopped
from temper.artifacts.formats.ensemble import EnsembleSpec, Step, order
from temper.artifacts.serving.counters import BACKEND, CANCELED, OTHER, REJECTED, Counters
from temper.artifacts.serving.runtime import Runtime

if TYPE_CHECKING:
    from temper.artifacts.serving.fallback import BurstFallback
    from temper.artifacts.serving.workers import WorkerPool

Arrays = dict[str, np.ndarray]
Find = Callable[[str], "Runtime | Ensemble"]  # a composing model's serving object, LookupError when not loaded


class Ensemble:
    """A loaded ensemble: what the servers and the exposition read of a Runtime, over the composing models."""

    pool: WorkerPool | None = None  # it runs no model of its own
    fallback: BurstFallback | None = None
    instances = 0
    host_warning: str | None = None
    drift_warning: str | None = None
    result = staticmethod(Runtime.result)

    def __init__(self, spec: EnsembleSpec, folder: Path, find: Find) -> None:
        self.spec, self.bundle, self.find = spec, folder, find
        self.config = spec.config
        self.steps = order(spec)
        self.metrics = Counters()
        self.max_rows = self.config.max_batch_size
        self._inputs = {s.name: s for s in self.config.inputs}
        self._started = False

    # -- lifecycle: the composing models start and stop themselves (artifacts/serving/models.py) -------------

    def start(self) -> None:
        self._started = True

    def stop(self) -> None:
        """Take no more requests; those in flight finish on the composing models (or fail when they stop)."""
        self._started = False

    def _composing(self) -> list[tuple[str, Runtime | Ensemble | None]]:
        found: list[tuple[str, Runtime | Ensemble | None]] = []
        for model in self.spec.models:
            try:
                found.append((model, self.find(model)))
            except LookupError:
                found.append((model, None))
        return found

    @property
    def ready(self) -> bool:
        return self._started and all(r is not None and r.ready for _, r in self._composing())

    @property
    def accepting(self) -> bool:
        return self._started and all(r is not None and r.accepting for _, r in self._composing())

    @property
    def taken_out(self) -> str | None:
        """Why the ensemble serves nothing until it is loaded again: a composing model taken out or unloaded."""
        if not self._started:
            return None
        for model, runtime in self._composing():
            if runtime is None:
                return f"its step model '{model}' is not loaded; load '{self.config.name}' again to load it"
            if runtime.taken_out:
                return f"its step model '{model}' is {runtime.taken_out}"
        return None

    @property
    def inline(self) -> bool:
        """Whether a lone request may run every step on the caller's thread: every composing model runs inline."""
        return all(r is not None and r.inline for _, r in self._composing())

    @property
    def pending(self) -> int:
        """Requests queued for the ensemble itself: none, its steps queue at the composing models."""
        return 0

    # -- requests ---------------------------------------------------------------------------

    def submit(self, inputs: Arrays, inline: bool = False, timeout_s: float | None = None) -> concurrent.futures.Future:
        """Check the request against the ensemble's inputs (RequestError), start the steps it can; the future gets
        the ensemble's outputs, or the error of the step that failed. `timeout_s`: each step's queue timeout."""
        if not self._started:
            self.metrics.record_failure(REJECTED)
            raise Stopped(f"ensemble '{self.config.name}' is stopped: it takes no more requests")
        try:
            rows = self._check(inputs)
        except RequestError:
            self.metrics.record_failure(OTHER)
            raise
        flight = _Flight(self, dict(inputs), rows, inline and self.inline, timeout_s)
        flight.advance()
        flight.caller = None  # steps started from now on run on the composing models' batchers
        return flight.future

    def infer(self, inputs: Arrays) -> Arrays:
        return self.result(self.submit(inputs), self.config.timeout_s)

    def _check(self, inputs: Arrays) -> int:
        """Names, dtypes, ranks, fixed dims and rows of the ensemble's inputs; the rows."""
        if not isinstance(inputs, dict):
            raise RequestError(f"inputs must be a dict of arrays, got {type(inputs).__name__}")
        unknown, missing = sorted(set(inputs) - set(self._inputs)), sorted(set(self._inputs) - set(inputs))
        if unknown or missing:
            raise RequestError(f"unknown input(s) {unknown}; expected {sorted(self._inputs)}" if unknown
                               else f"missing input(s) {missing}")
        rows = set()
        for name, spec in self._inputs.items():
            array = inputs[name]
            if not isinstance(array, np.ndarray) or array.dtype != np.dtype(spec.dtype):
                raise RequestError(f"input {name!r} must be a {spec.dtype} array")
            if array.ndim != len(spec.shape) or any(want > 0 and got != want for axis, (got, want)
                                                    in enumerate(zip(array.shape, spec.shape))
                                                    if axis != spec.batch_axis):
                raise RequestError(f"input {name!r} has shape {list(array.shape)}, expected {spec.shape} (-1 = any)")
            if spec.batch_axis is not None:
                rows.add(array.shape[spec.batch_axis])
        if len(rows) > 1:
            raise RequestError(f"inputs disagree on the number of rows: {sorted(rows)}")
        n = rows.pop() if rows else 1
        if n < 1 or n > self.max_rows:
            raise RequestError(f"{n} rows: an ensemble request takes 1 to max_batch_size {self.max_rows}")
        return n


def _reason(exc: BaseException) -> str:
    """The failure reason a step's error counts as for the ensemble (artifacts/serving/counters.py)."""
    if isinstance(exc, InstanceLost):
        return BACKEND
    if isinstance(exc, (Overloaded, RequestTimeout, Stopped)):
        return REJECTED
    if isinstance(exc, RequestError):
        return OTHER
    if isinstance(exc, concurrent.futures.CancelledError):
        return CANCELED
    return BACKEND


class _Flight:
    """One ensemble request: its tensors so far, the steps waiting and running, and the future its caller holds."""

    def __init__(self, ensemble: Ensemble, tensors: Arrays, rows: int, inline: bool, timeout_s: float | None) -> None:
        self.ensemble, self.tensors, self.rows, self.timeout_s = ensemble, tensors, rows, timeout_s
        self.inline = inline
        self.caller: int | None = threading.get_ident()  # steps started on this thread while submit() runs
        self.waiting: list[Step] = list(ensemble.steps)
        self.running: dict[int, concurrent.futures.Future] = {}
        self.lock = threading.Lock()
        self.began = time.perf_counter_ns()
        self.future: concurrent.futures.Future = concurrent.futures.Future()
        self.future.add_done_callback(self._ended)

    def advance(self) -> None:
        """Start every step whose tensors exist; answer once no step waits or runs."""
        with self.lock:
            runnable = [s for s in self.waiting if all(t in self.tensors for t in s.inputs.values())]
            for step in runnable:
                self.waiting.remove(step)
        for step in runnable:
            self._start(step)
        with self.lock:
            finished = not self.waiting and not self.running and not self.future.done()
        if finished:
            self._answer()

    def _start(self, step: Step) -> None:
        if self.future.done():
            return
        feed = {model_input: self.tensors[tensor] for model_input, tensor in step.inputs.items()}
        try:
            try:
                runtime = self.ensemble.find(step.model)
            except LookupError:
                raise Stopped(f"step model '{step.model}' of ensemble '{self.ensemble.config.name}' is not "
                              "loaded") from None
            if not runtime.accepting:
                raise Stopped(f"step model '{step.model}' of ensemble '{self.ensemble.config.name}' is not ready")
            inline = self.inline and threading.get_ident() == self.caller
            future = runtime.submit(feed, inline=inline, timeout_s=self.timeout_s)
        except Exception as exc:  # noqa: BLE001 - the step's refusal is the request's answer
            self._fail(exc)
            return
        key = id(step)
        with self.lock:
            self.running[key] = future
        future.add_done_callback(lambda done: self._finished(step, key, done))

    def _finished(self, step: Step, key: int, done: concurrent.futures.Future) -> None:
        with self.lock:
            self.running.pop(key, None)
        if self.future.done():
            return  # failed or abandoned already
        try:
            outputs = done.result()
        except BaseException as exc:  # noqa: BLE001 - CancelledError included: the step's failure is the request's
            self._fail(exc)
            return
        with self.lock:
            for model_output, tensor in step.outputs.items():
                self.tensors[tensor] = outputs[model_output]
        self.advance()

    def _answer(self) -> None:
        outputs = {spec.name: self.tensors[spec.name] for spec in self.ensemble.config.outputs}
        now = time.perf_counter_ns()
        try:
            self.future.set_result(outputs)
        except concurrent.futures.InvalidStateError:  # its caller gave up first (_ended counted it)
            return
        self.ensemble.metrics.record_rows(self.rows)
        self.ensemble.metrics.record_success(now - self.began)

    def _fail(self, exc: BaseException) -> None:
        try:
            self.future.set_exception(exc)
        except concurrent.futures.InvalidStateError:
            return
        self.ensemble.metrics.record_failure(_reason(exc), 1, time.perf_counter_ns() - self.began)
        self._abandon_steps()

    def _ended(self, future: concurrent.futures.Future) -> None:
        """The future is done: when its caller abandoned it (abandon() cancels a future nobody set running), so
        are the steps in flight, and the request is a failure."""
        if not future.cancelled():
            return  # answered by _answer or _fail
        self.ensemble.metrics.record_failure(CANCELED, 1, time.perf_counter_ns() - self.began)
        self._abandon_steps()

    def _abandon_steps(self) -> None:
        from temper.artifacts.serving.batcher import abandon

        with self.lock:
            running, self.waiting = list(self.running.values()), []
        for future in running:
            abandon(future, f"its ensemble '{self.ensemble.config.name}' request failed or was abandoned")
