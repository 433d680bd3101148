"""The serving runtime: one ONNX Runtime session behind a dynamic batcher.

Shipped inside MLflow models (code_paths), so it imports only artifacts/ modules,
never pipeline/, calibration/ or validators/.

Batching rule (measured with benchmarks/serving.py): when the engine becomes free it
takes what is already queued, up to max_batch_size rows. It waits for more (until
max_delay_ms after the batch's first request arrived) only while the batch holds fewer
requests than the previous batch did, i.e. only when recent traffic showed concurrent
clients. A lone sequential client therefore never pays the delay, and 2 closed-loop
clients are not held back waiting for a 16-row batch that will never fill.

Tiny models skip the batcher when it is idle: a request that finds nothing queued and nothing
running is run on the caller's thread (submit(inline=True)), saving the two thread hand-offs
(batcher wake-up, answer back) that cost more than the run itself. Start-up also times a
batch-1 run with one intra-op thread and with all usable cores on the CPU engine and keeps the faster.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnxruntime as ort

from artifacts.bundle import MODEL, ServingConfig, read
from artifacts.host import HostProfile, profile, usable_cores

log = logging.getLogger("temper.serving")

TENSORRT = "TensorrtExecutionProvider"
CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"
WARMUP_DYNAMIC_DIM = 8  # length used for dynamic non-batch dims during warm-up
# Runs shorter than this (batch 1, median at start-up) go inline on the caller's thread when
# the engine is idle. The caller is the server's event loop, which serves no other connection
# meanwhile: the digits CNN (0.05 ms) measured 3.2-3.3x `mlflow models serve` at 1 client
# inline vs 2.5x through the batcher; a heavy CNN (2.7 ms) would stall every other client.
INLINE_MAX_MS = 0.2
TIMING_RUNS = 21  # batch-1 runs per session timed at start-up (median), fewer for slow models
TIMING_BUDGET_S = 0.25  # per session, after which timing stops once MIN_TIMING_RUNS ran
MIN_TIMING_RUNS = 3
Providers = list[str | tuple[str, dict[str, str]]]  # an InferenceSession provider chain


class RequestError(ValueError):
    """Bad request (HTTP 400): the message says what is wrong."""


class Overloaded(RuntimeError):
    """Queue full (HTTP 503)."""


class RequestTimeout(TimeoutError):
    """Not answered within config.timeout_s."""


@dataclass
class Metrics:
    """Thread-safe counters read by /metrics and /stats; names mirror Triton's nv_inference_* family.

    queue_ns and the compute_*_ns are summed per request, as Triton does (a request in a batch
    of 8 adds the whole batch's compute time); executed_requests is how many requests those
    sums cover. batches[rows] = [executions, input_ns, infer_ns, output_ns] per batch size, for
    Triton's batch_stats. latency_counts[i] counts successful requests with latency <=
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

    def record_inline(self) -> None:
        with self._lock:
            self.inline_count += 1

    def record_success(self, latency_ns: int) -> None:
        ms = latency_ns / 1e6
        with self._lock:
            self.request_success += 1
            self.success_ns += latency_ns
            self.latency_sum_ms += ms
            self.latency_count += 1
            for i, bound in enumerate(self.latency_buckets_ms):
                if ms <= bound:
                    self.latency_counts[i] += 1

    def record_failure(self, requests: int = 1, duration_ns: int = 0) -> None:
        """`requests` failed requests that took `duration_ns` between them."""
        with self._lock:
            self.request_failure += requests
            self.failure_ns += duration_ns

    def snapshot(self) -> dict:
        """A consistent copy of every counter (taken under the lock)."""
        with self._lock:
            return {
                "request_success": self.request_success,
                "request_failure": self.request_failure,
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


@dataclass
class _Request:
    inputs: dict[str, np.ndarray]
    rows: int
    length: int | None  # axis-1 length of the padded inputs, None when the config pads nothing
    key: tuple  # shapes that must match for requests to share a batch
    future: concurrent.futures.Future
    arrived_ns: int = field(default_factory=time.perf_counter_ns)


def engine_cache() -> Path:
    """Where TensorRT engines built on this host are kept ($TEMPER_ENGINE_CACHE, else ~/.cache/temper/engines)."""
    return Path(os.environ.get("TEMPER_ENGINE_CACHE") or Path.home() / ".cache" / "temper" / "engines")


class Runtime:
    """Loads a bundle, picks the engine, batches concurrent requests on one inference thread."""

    def __init__(self, bundle: Path, providers: list[str] | None = None, config: ServingConfig | None = None) -> None:
        """`bundle` holds model.onnx and, unless `config` is given, runtime.json; with `config`, any
        folder holding a model.onnx serves (a run's output folder, not yet published)."""
        self.bundle = Path(bundle)
        self.config: ServingConfig = config or read(self.bundle)
        self.metrics = Metrics()
        self._inputs = {spec.name: spec for spec in self.config.inputs}
        self._dynamic_axis1 = {s.name for s in self.config.outputs if len(s.shape) > 1 and s.shape[1] == -1}
        fixed_batch = {s.shape[0] for s in self.config.inputs if s.shape and s.shape[0] > 0}
        self._fixed_batch = min(fixed_batch) if fixed_batch else None
        self.max_rows = min([self.config.max_batch_size, *fixed_batch])
        self.intra_op_threads = usable_cores()  # start() may settle on 1 (CPU engine only)
        self.host_warning: str | None = _host_warning(self.config.measured_on)  # once: profile() probes the host
        if self.host_warning:
            log.warning("%s: %s", self.config.name, self.host_warning)
        self._session, self.engine = self._load(providers)
        self._output_names = [o.name for o in self._session.get_outputs()]
        self.batch1_ms: float | None = None  # median run of the smallest batch (1 unless fixed), timed by start()
        self.inline = False  # start() sets it when batch1_ms < INLINE_MAX_MS
        self._queue: deque[_Request] = deque()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._running = False
        self._busy = False  # a batch or an inline run is executing; guarded by _cond
        self._ready = False
        self._last_batch_requests = 0

    # -- engine -----------------------------------------------------------------------------

    def _load(self, providers: list[str] | None) -> tuple[ort.InferenceSession, str]:
        """One session on the best engine this host really runs: TensorRT, else CUDA, else CPU.

        TensorRT goes through ONNX Runtime's TensorRT provider, which builds the engine for this
        GPU on first load and caches it (keyed by TensorRT version and GPU) under the engine cache,
        so the bundle stays portable across GPUs. Precision comes from the graph (FP16 casts, QDQ),
        as TensorRT 11 has no precision flags. A requested provider the session did not activate
        is logged, never silently reported as the engine.
        """
        available = ort.get_available_providers()
        if providers is None:
            providers = [p for p in (TENSORRT, CUDA) if p in available] + [CPU]
        if TENSORRT in providers:
            engine_cache().mkdir(parents=True, exist_ok=True)
        chain: Providers = [
            (p, {"trt_engine_cache_enable": "True", "trt_engine_cache_path": str(engine_cache())}) if p == TENSORRT else p
            for p in providers
        ]
        session = self._open(chain, self.intra_op_threads)
        used = session.get_providers()
        engine = {TENSORRT: "tensorrt", CUDA: "cuda"}.get(used[0] if used else CPU, "cpu")
        if providers[0] != CPU and used[0] != providers[0]:
            log.warning("%s: %s requested but the session runs on %s", self.config.name, providers[0], used)
        log.info("%s: engine=%s providers=%s intra_op_threads=%d", self.config.name, engine, used, self.intra_op_threads)
        return session, engine

    def _open(self, chain: Providers, threads: int) -> ort.InferenceSession:
        """A session on `chain` with `threads` intra-op threads that sleep, not spin, when idle.

        Spinning intra-op threads burn every core even when idle (measured 180-200% CPU at
        any load on 2 cores), starving the HTTP threads that feed the batcher. One
        inference thread runs back-to-back batches under load, so spinning buys little.
        """
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        return ort.InferenceSession(str(self.bundle / MODEL), options, providers=chain)

    def _tune(self) -> None:
        """Time the smallest batch; on the CPU engine with several cores, also on a one-thread
        session, and keep the faster. Then decide whether requests may run inline.

        Neither thread count wins everywhere: one thread gave the digits CNN +23% at 32 clients
        (no per-operator wake-up of sleeping threads) but halves a 2.7 ms CNN. Batch 1 is timed
        because that is what the difference shows on, and what an inline run executes.
        """
        inputs = self._warmup_inputs(self._fixed_batch or 1)
        sessions = [self._session]
        if self.engine == "cpu" and self.intra_op_threads > 1:
            sessions.append(self._open([CPU], 1))
        times = _median_runs_s(sessions, inputs)
        best = min(range(len(sessions)), key=times.__getitem__)
        if best:
            self._session, self.intra_op_threads = sessions[best], 1
        self.batch1_ms = times[best] * 1000
        self.inline = self.batch1_ms < INLINE_MAX_MS
        log.info("%s: batch-1 run %s ms -> intra_op_threads=%d, inline runs %s", self.config.name,
                 " vs ".join(f"{t * 1000:.3f}" for t in times), self.intra_op_threads, "on" if self.inline else "off")

    # -- lifecycle --------------------------------------------------------------------------

    def warm_up(self) -> None:
        """Run every batch size the batcher can form once, so no request pays for a first run.

        Every size, because CUDA/cuDNN pick kernels per shape: the first request to hit an
        unseen batch size would otherwise pay for it (max_batch_size runs, once per load).
        """
        sizes = [self._fixed_batch] if self._fixed_batch else range(1, self.max_rows + 1)
        began = time.perf_counter()
        for rows in sizes:
            self._run(self._warmup_inputs(rows))
        log.info("%s: warmed up batch sizes up to %d in %.2fs", self.config.name, self.max_rows, time.perf_counter() - began)

    def start(self) -> None:
        """Pick the thread count, warm up, then start the single batching thread; only then
        report ready.

        Requests submitted before start() wait in the queue and are served once it runs.
        """
        if self._thread is not None:
            return
        self._tune()
        self.warm_up()
        self._running = True
        self._thread = threading.Thread(target=self._serve, name=f"temper-batcher-{self.config.name}", daemon=True)
        self._thread.start()
        self._ready = True

    @property
    def ready(self) -> bool:
        return self._ready

    @property
    def pending(self) -> int:
        """Requests queued and not yet taken into a batch (Triton's pending request count)."""
        return len(self._queue)

    def stop(self) -> None:
        """Stop the batching thread; requests still queued fail instead of hanging."""
        self._ready = False
        with self._cond:
            self._running = False
            pending = list(self._queue)
            self._queue.clear()
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        for request in pending:
            if request.future.set_running_or_notify_cancel():
                request.future.set_exception(RuntimeError("runtime stopped"))
        now = time.perf_counter_ns()
        self.metrics.record_failure(len(pending), sum(now - r.arrived_ns for r in pending))

    def _warmup_inputs(self, rows: int) -> dict[str, np.ndarray]:
        return {
            s.name: np.zeros([rows] + [d if d > 0 else WARMUP_DYNAMIC_DIM for d in s.shape[1:]], dtype=s.dtype)
            for s in self.config.inputs
        }

    # -- requests ---------------------------------------------------------------------------

    def submit(self, inputs: dict[str, np.ndarray], inline: bool = False) -> concurrent.futures.Future:
        """Validate now (RequestError), queue (Overloaded when full); the future gets this
        request's own output rows.

        With `inline`, a tiny model (self.inline) whose engine is idle runs the request on this
        thread and returns a finished future. Callers that know other requests are about to
        arrive (the server's event loop) pass False so that those can share a batch.
        """
        try:
            rows = self._validate(inputs, self.max_rows)
        except RequestError:
            self.metrics.record_failure()
            raise
        length = self._pad_length(inputs)
        key = tuple(inputs[name].shape[2 if name in self.config.pad else 1 :] for name in self._inputs)
        request = _Request(dict(inputs), rows, length, key, concurrent.futures.Future())
        with self._cond:
            run_here = inline and self._idle()
            if run_here:
                self._busy = True
                self._last_batch_requests = 1
            else:
                if len(self._queue) >= self.config.max_queue:
                    self.metrics.record_failure()
                    raise Overloaded(f"queue full ({self.config.max_queue} requests waiting)")
                self._queue.append(request)
                self._cond.notify()
        if run_here:
            self._run_inline(request)
        return request.future

    def _idle(self) -> bool:
        """Whether a request may run inline: tiny model, serving, nothing queued or running.
        Called with the lock held."""
        return self.inline and self._running and not self._busy and not self._queue

    def _run_inline(self, request: _Request) -> None:
        """Execute one request as a batch of one on this thread; _busy is already set."""
        try:
            self.metrics.record_inline()
            request.future.set_running_or_notify_cancel()
            self._execute([request])
        finally:
            self._release()

    def _release(self) -> None:
        """The engine is free again: wake the batcher for requests queued meanwhile."""
        with self._cond:
            self._busy = False
            if self._queue:
                self._cond.notify()

    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """submit() and wait up to config.timeout_s."""
        future = self.submit(inputs)
        try:
            return future.result(timeout=self.config.timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()  # still queued: the batcher skips it
            raise RequestTimeout(f"not answered within {self.config.timeout_s}s") from None

    def run_batch(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run any number of rows directly in chunks of max_batch_size, bypassing the queue
        (offline pyfunc predict on big inputs)."""
        rows = self._validate(inputs, None)
        chunks = []
        for start in range(0, rows, self.max_rows):
            began = time.perf_counter_ns()
            chunks.append(self._run({name: a[start : start + self.max_rows] for name, a in inputs.items()}))
            self.metrics.record_execution(min(self.max_rows, rows - start), 1, 0, time.perf_counter_ns() - began)
        return {name: np.concatenate([c[name] for c in chunks]) for name in self._output_names}

    def _validate(self, inputs: dict[str, np.ndarray], max_rows: int | None) -> int:
        """Check names, dtypes, ranks, fixed dims and row counts against the config, and that float
        inputs are finite (an INT8 model answers NaN with plausible logits); the row count."""
        if not isinstance(inputs, dict):
            raise RequestError(f"inputs must be a dict of arrays, got {type(inputs).__name__}")
        unknown = sorted(set(inputs) - set(self._inputs))
        missing = sorted(set(self._inputs) - set(inputs))
        if unknown:
            raise RequestError(f"unknown input(s) {unknown}; expected {sorted(self._inputs)}")
        if missing:
            raise RequestError(f"missing input(s) {missing}")
        rows = set()
        for name, spec in self._inputs.items():
            array = inputs[name]
            if not isinstance(array, np.ndarray):
                raise RequestError(f"input {name!r} must be a numpy array, got {type(array).__name__}")
            if array.dtype != np.dtype(spec.dtype):
                raise RequestError(f"input {name!r} has dtype {array.dtype}, expected {spec.dtype}")
            if array.dtype.kind == "f" and not np.isfinite(array).all():
                raise RequestError(f"input {name!r} holds NaN or infinite values")
            if array.ndim != len(spec.shape):
                raise RequestError(f"input {name!r} has shape {list(array.shape)}, expected rank {len(spec.shape)} like {spec.shape}")
            for axis, (got, want) in enumerate(zip(array.shape, spec.shape)):
                if axis and want > 0 and got != want:
                    raise RequestError(f"input {name!r} has shape {list(array.shape)}, expected {spec.shape} (-1 = any)")
            rows.add(array.shape[0])
        if len(rows) > 1:
            raise RequestError(f"inputs disagree on the number of rows: {sorted(rows)}")
        (n,) = rows
        if n < 1:
            raise RequestError("a request needs at least one row")
        if self._fixed_batch and n % self._fixed_batch:
            raise RequestError(f"this model takes batches of exactly {self._fixed_batch} rows, got {n}")
        if max_rows is not None and n > max_rows:
            raise RequestError(f"{n} rows exceed max_batch_size {max_rows}")
        if self._pad_length(inputs) == 0:
            raise RequestError(f"padded inputs {sorted(self.config.pad)} need at least one position on axis 1")
        return n

    def _pad_length(self, inputs: dict[str, np.ndarray]) -> int | None:
        lengths = {inputs[name].shape[1] for name in self.config.pad}
        if len(lengths) > 1:
            raise RequestError(f"padded inputs {sorted(self.config.pad)} disagree on axis-1 length: {sorted(lengths)}")
        return lengths.pop() if lengths else None

    # -- batching thread --------------------------------------------------------------------

    def _serve(self) -> None:
        while (batch := self._next_batch()) is not None:
            if batch:
                self._execute(batch)
                self._release()

    def _next_batch(self) -> list[_Request] | None:
        """Block until work arrives and no inline run holds the engine; None once stopped. See
        the module docstring for the rule. A non-empty batch marks the engine busy."""
        with self._cond:
            while self._running and (self._busy or not self._queue):
                self._cond.wait()
            if not self._running:
                return None
            batch: list[_Request] = []
            self._take(batch)
            if batch:
                self._busy = True  # from now on, while it waits to fill: no request overtakes it
                deadline = batch[0].arrived_ns + int(self.config.max_delay_ms * 1e6)
                while (
                    self._running
                    and len(batch) < self._last_batch_requests
                    and sum(r.rows for r in batch) < self.max_rows
                    and (remaining := deadline - time.perf_counter_ns()) > 0
                ):
                    self._cond.wait(remaining / 1e9)
                    self._take(batch)
                self._last_batch_requests = len(batch)
            return batch

    def _take(self, batch: list[_Request]) -> None:
        """Move queued requests that fit (rows, shapes) into `batch`, in arrival order,
        dropping cancelled and expired ones. Called with the lock held."""
        rows = sum(r.rows for r in batch)
        now = time.perf_counter_ns()
        expiry = now - int(self.config.timeout_s * 1e9)
        kept: deque[_Request] = deque()
        while self._queue:
            request = self._queue.popleft()
            if request.arrived_ns < expiry:
                if request.future.set_running_or_notify_cancel():
                    request.future.set_exception(RequestTimeout(f"not answered within {self.config.timeout_s}s"))
                self.metrics.record_failure(1, now - request.arrived_ns)
            elif rows + request.rows > self.max_rows or (batch and request.key != batch[0].key):
                kept.append(request)
            elif request.future.set_running_or_notify_cancel():
                batch.append(request)
                rows += request.rows
            else:
                self.metrics.record_failure(1, now - request.arrived_ns)  # cancelled by its caller (infer timed out)
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
            log.exception("%s: batch of %d requests failed", self.config.name, len(batch))
            for request in batch:
                request.future.set_exception(exc)
            failed = time.perf_counter_ns()
            self.metrics.record_failure(len(batch), sum(failed - r.arrived_ns for r in batch))
            return
        done = time.perf_counter_ns()
        queued = sum(started - r.arrived_ns for r in batch)
        self.metrics.record_execution(sum(r.rows for r in batch), len(batch), queued, computed - merged_ns,
                                      merged_ns - started, done - computed)
        for request, result in zip(batch, results):
            request.future.set_result(result)
            self.metrics.record_success(done - request.arrived_ns)

    def _merge(self, batch: list[_Request]) -> dict[str, np.ndarray]:
        """Concatenate the batch's rows, padding config.pad inputs on axis 1 to the longest."""
        if len(batch) == 1:
            return batch[0].inputs
        longest = max(r.length or 0 for r in batch)
        merged = {}
        for name in self._inputs:
            parts = [r.inputs[name] for r in batch]
            if name in self.config.pad:
                value = self.config.pad[name]
                parts = [_pad_axis1(p, longest, value) for p in parts]
            merged[name] = np.concatenate(parts)
        return merged

    def _split(self, batch: list[_Request], outputs: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
        """Each request's rows; padded-length outputs sliced back to the request's own length."""
        total = sum(r.rows for r in batch)
        for name, array in outputs.items():
            if array.ndim == 0 or array.shape[0] != total:
                raise RuntimeError(f"output {name!r} has shape {list(array.shape)}: not batch-major over {total} rows")
        longest = max(r.length or 0 for r in batch)
        results, offset = [], 0
        for request in batch:
            own = {}
            for name, array in outputs.items():
                part = array[offset : offset + request.rows]
                if request.length is not None and name in self._dynamic_axis1 and array.shape[1] == longest:
                    part = part[:, : request.length]
                own[name] = part
            results.append(own)
            offset += request.rows
        return results

    def _run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(self._output_names, self._session.run(self._output_names, inputs)))


def _host_warning(measured_on: HostProfile | None) -> str | None:
    """Why the bundle's published speed may not hold on this host (ISA features it was measured
    with that this CPU lacks, e.g. VNNI for INT8), or None. Probes the host only when there is
    something to compare with."""
    if measured_on is None:
        return None
    here = profile()
    missing = here.missing(measured_on)
    if not missing:
        return None
    lacks = missing[0] if len(missing) == 1 else ", ".join(missing[:-1]) + " and " + missing[-1]
    return (f"this host ({here.cpu}) lacks {lacks}, which the bundle's speed was measured with on "
            f"{measured_on.cpu}: its published speedup may not hold here")


def _median_runs_s(sessions: list[ort.InferenceSession], inputs: dict[str, np.ndarray]) -> list[float]:
    """Median seconds per run of `inputs` on each session, runs interleaved so that noise
    from other processes hits every session alike. One untimed run each first."""
    for session in sessions:
        session.run(None, inputs)
    samples: list[list[float]] = [[] for _ in sessions]
    deadline = time.perf_counter() + TIMING_BUDGET_S * len(sessions)
    for done in range(TIMING_RUNS):
        if done >= MIN_TIMING_RUNS and time.perf_counter() > deadline:
            break
        for session, times in zip(sessions, samples):
            start = time.perf_counter()
            session.run(None, inputs)
            times.append(time.perf_counter() - start)
    return [float(np.median(times)) for times in samples]


def _pad_axis1(array: np.ndarray, length: int, value: float) -> np.ndarray:
    if array.shape[1] == length:
        return array
    widths = [(0, 0), (0, length - array.shape[1])] + [(0, 0)] * (array.ndim - 2)
    return np.pad(array, widths, constant_values=value)
