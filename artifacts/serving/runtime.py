"""The serving runtime: one ONNX Runtime session, or one OpenVINO compiled model, behind a dynamic batcher.

Shipped inside MLflow models (code_paths), so it imports only artifacts/ modules,
never pipeline/, calibration/ or validators/.

Runtime is the one object the servers and the pyfunc model hold. It checks each request against
the bundle's config and ties together the parts that live in their own modules: the engine and
its sessions (artifacts/engines/), the batcher and its batching rule (artifacts/serving/batcher.py) and
the request counters (artifacts/serving/counters.py). The exceptions it raises are in artifacts/core/errors.py
and importable from here, where callers have always found them.

The session is built from runtime.json's `session` (artifacts/engines/onnxruntime.py), the settings the speed
gates measured the model with, threads included. Only without them (nothing was measured), or on a
host with fewer usable cores than they name (logged), does start-up choose the thread count itself,
the way the gates did (engines.threads.choose_threads). A model whose batch-1 run is shorter than
INLINE_MAX_MS may run a lone request on the caller's thread (see artifacts/serving/batcher.py).

Instances (Triton's instance_group count): with `instances` 0 the session runs in this process, as
the pyfunc model and most tests use it. With 1 or more, start() chooses threads here as before, then
runs the model in that many worker processes (artifacts/serving/workers.py, tensors through shared memory,
artifacts/serving/tensor_memory.py), each warmed up before it counts as ready, and drops its own session: a
crash in native code then ends a worker, not the server. An OpenVINO engine runs in workers the same
way, each compiled with the settings read back from this process's compiled model. None (`temper
serve`'s default): default_instances(), usable cores over the engine's intra-op threads, except for
a model that runs inline (batch-1 under INLINE_MAX_MS): its run is shorter than the hand-off to a
worker (two process wake-ups, measured 0.5-1 ms a request on a loaded 2-core host,
benchmarks/serving_workers.py), which would double its one-client latency, so it stays in this
process unless `instances` asks. A bundle with a capacity.json (`temper capacity`) serves with the batch size,
delay and, when `instances` is None, the instance count it chose (artifacts/formats/capacity.py).
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from pathlib import Path

import numpy as np

from temper.artifacts import engines
from temper.artifacts.core import layout, versions
from temper.artifacts.core.errors import Overloaded, RequestError, RequestTimeout, Stopped
from temper.artifacts.core.host import HostProfile, profile, usable_cores
from temper.artifacts.engines import Engine, EngineSettings, Session, threads
from temper.artifacts.engines.onnxruntime import SessionSettings
from temper.artifacts.engines.providers import CPU, PROVIDERS, Provider
from temper.artifacts.formats import capacity
from temper.artifacts.formats.bundle import MODEL, ServingConfig, check_describes, example_inputs, read
from temper.artifacts.serving.batcher import Batcher, abandon, pad_length
from temper.artifacts.serving.counters import OTHER, Counters
from temper.artifacts.serving.fallback import BurstFallback
from temper.artifacts.serving.graph_batches import GraphBatches
from temper.artifacts.serving.workers import CRASH_LOOP_DEATHS, CRASH_LOOP_S, WorkerPool

__all__ = ["INLINE_MAX_MS", "Overloaded", "RequestError", "RequestTimeout", "Runtime", "Stopped"]

log = logging.getLogger("temper.serving")

WARMUP_DYNAMIC_DIM = 8  # length used for dynamic non-batch dims during warm-up
# Runs shorter than this (batch 1, median at start-up) go inline on the caller's thread when
# the engine is idle. The caller is the server's event loop, which serves no other connection
# meanwhile: the digits CNN (0.05 ms) measured 3.2-3.3x `mlflow models serve` at 1 client
# inline vs 2.5x through the batcher; a heavy CNN (2.7 ms) would stall every other client.
INLINE_MAX_MS = 0.2


class Runtime:
    """Loads a bundle, picks the engine, batches concurrent requests on one inference thread per instance
    (one in-process session, or worker processes)."""

    def __init__(self, bundle: Path, providers: list[str] | None = None, config: ServingConfig | None = None,
                 instances: int | None = 0) -> None:
        """`bundle` holds model.onnx and, unless `config` is given, runtime.json; with `config`, any
        folder holding a model.onnx serves (a run's output folder, not yet published). `instances`:
        worker processes to run the model in (0: this process; None: default_instances())."""
        if instances is not None and instances < 0:
            raise ValueError(f"instances must be 0 or more, got {instances}")
        self.bundle = Path(bundle)
        self.config: ServingConfig = config or read(self.bundle)
        measured = capacity.read(self.bundle)  # `temper capacity`'s choice, unless a flag says otherwise
        if measured is not None:
            self.config = measured.serving(self.config)
            instances = measured.chosen.instances if instances is None else instances
        self.instances = instances
        check_describes(self.config, self.bundle / MODEL)  # ValueError: a config of another model
        self.metrics = Counters()
        self._inputs = {spec.name: spec for spec in self.config.inputs}
        self._layout = self.config.layout()
        fixed_batch = {s.shape[s.batch_axis] for s in self.config.inputs
                       if s.batch_axis is not None and s.shape[s.batch_axis] > 0}
        self._fixed_batch = min(fixed_batch) if fixed_batch else None
        self.max_rows = self.config.max_rows()
        self.host_warning: str | None = _host_warning(self.config.measured_on)  # once: profile() probes the host
        if self.host_warning:
            log.warning("%s: %s", self.config.name, self.host_warning)
        self.drift_warning: str | None = _drift_warning(self.config.gated_with)
        if self.drift_warning:
            log.warning("%s: %s", self.config.name, self.drift_warning)
        # the bundle's engine, unless `providers` names ONNX Runtime providers to run on
        self._engine = engines.of(self.config.engine or "cpu" if providers is None else "cpu")
        recorded, self._choose = _settings(self.config, self._engine)  # start() chooses threads when _choose
        self._session: Session | None
        self._providers: list[str] = []  # the providers the session really runs, which the workers are given
        self.provider: Provider
        self.settings: EngineSettings  # what the model really runs with, read back where the runtime can
        self._session, self.provider, self.settings = self._engine.serve(
            self.bundle / MODEL, self.config.engine if providers is None else None, recorded, providers,
            self.config.name)
        self._output_names = [o.name for o in self._session.get_outputs()]
        graphs = getattr(self.settings, "cuda_graph", False) and not (self.config.batch_dependent or self._fixed_batch)
        self._graph_batches = GraphBatches(self._layout, self.max_rows, graphs)  # CUDA graphs: a few batch sizes
        self.batch1_ms: float | None = None  # median run of the smallest batch (1 unless fixed), timed by start()
        self.inline = False  # start() sets it when batch1_ms < INLINE_MAX_MS
        self._batcher = Batcher(self.config, self.max_rows, self._run, self.metrics)
        self.pool: WorkerPool | None = None  # start() starts it when instances > 0
        self.fallback: BurstFallback | None = None  # the burst fallback's backup model (artifacts/serving/fallback.py)
        self._ready = False

    # -- lifecycle --------------------------------------------------------------------------

    @property
    def intra_op_threads(self) -> int:
        return self.settings.threads

    @property
    def engine_settings(self) -> EngineSettings:
        """What the model really runs with (OpenVINO's compiled model read back, or the ONNX Runtime settings)."""
        return self.settings

    def _tune(self) -> None:
        """Time the smallest batch, and on the CPU engine, when runtime.json recorded no thread choice
        this host can honour, choose the thread count as the speed gates do (threads.choose_threads).
        Then decide whether requests may run inline."""
        inputs = self._warmup_inputs(self._fixed_batch or 1)
        assert self._session is not None, "_tune runs on this process's session"
        if self.provider == "cpu" and self._choose and isinstance(self.settings, SessionSettings):
            self._session, self.settings, times = threads.choose_threads(
                self.bundle / MODEL, self._session, self.settings, inputs, [CPU])
            self.batch1_ms = min(times) * 1000
        else:
            times = threads.median_runs_s([self._session], inputs)
            self.batch1_ms = times[0] * 1000
        self.inline = self.batch1_ms < INLINE_MAX_MS
        log.info("%s: batch-1 run %s ms -> intra_op_threads=%d (%s), inline runs %s", self.config.name,
                 " vs ".join(f"{t * 1000:.3f}" for t in times), self.intra_op_threads,
                 "chosen here" if self._choose else "as runtime.json records", "on" if self.inline else "off")

    def warm_up(self) -> None:
        """Run every batch size the batcher can form once, so no request pays for a first run.

        Every size, because CUDA/cuDNN pick kernels per shape: the first request to hit an
        unseen batch size would otherwise pay for it (max_batch_size runs, once per load).
        """
        sizes = [self._fixed_batch] if self._fixed_batch else range(1, self.max_rows + 1)
        began = time.perf_counter()
        for rows in sizes:
            self._run(self._warmup_inputs(rows))
        log.info("%s: warmed up batch sizes up to %d in %.2fs", self.config.name, self.max_rows,
                 time.perf_counter() - began)

    def start(self) -> None:
        """Pick the thread count, warm up, then start the single batching thread; only then
        report ready.

        Requests submitted before start() wait in the queue and are served once it runs.
        """
        if self._batcher.started:
            return
        if self._session is not None:  # not when a pool ran before: start() after stop()
            self._tune()
        if self.instances is None:
            gpu = PROVIDERS[self.provider].gpu
            self.instances = 0 if self.inline else default_instances(self.intra_op_threads, gpu)
            log.info("%s: %d worker instance(s) by default%s", self.config.name, self.instances,
                     ": the model runs inline, faster than a hand-off to a worker (--instances N isolates it)"
                     if self.inline else "")
        if self.instances:
            self._start_pool()
        else:
            self.warm_up()
        self._batcher.instances = max(1, self.instances)
        self._batcher.start(self.config.name)
        if self.fallback is not None:
            self.fallback.backup.start()
        self._ready = True

    def _start_pool(self) -> None:
        """Run the model in self.instances worker processes, each warmed up by the pool, with the settings
        and providers this process chose; then drop this process's own session."""
        if self._session is not None:
            self._providers = self._session.get_providers()
        sizes = [self._fixed_batch] if self._fixed_batch else range(1, self.max_rows + 1)
        self.pool = WorkerPool(self.bundle / MODEL, self.config, self.provider, self.engine_settings, self._providers,
                               int(self.instances or 0), self.max_rows,
                               lambda: [self._warmup_inputs(rows) for rows in sizes])
        began = time.perf_counter()
        self.pool.start()
        self._session = None  # the workers run the model now; a crash in it is theirs
        log.info("%s: %d worker instance(s) started and warmed up in %.2fs", self.config.name, self.instances,
                 time.perf_counter() - began)

    @property
    def ready(self) -> bool:
        """Started, and with instances, at least one of them ready (what the health endpoints answer)."""
        return self._ready and (self.pool is None or self.pool.ready_count > 0)

    @property
    def taken_out(self) -> str | None:
        """Why the model serves nothing until it is loaded again (every worker instance died too often), or None
        while it serves, starts or restarts an instance."""
        if self._ready and self.pool is not None and self.pool.taken_out:
            return (f"taken out: every instance's worker died {CRASH_LOOP_DEATHS} times within {CRASH_LOOP_S:.0f} s "
                    f"(last: {self.pool.last_death}); load it again to restart it")
        return None

    @property
    def accepting(self) -> bool:
        """Whether the servers queue an inference request: started, and with instances, one not taken out.
        While every instance left is restarting, requests wait in the queue (up to their timeout) for it, so
        a crash fails only the batch it hit; the health endpoints meanwhile say not ready."""
        return self._ready and (self.pool is None or self.pool.alive_count > 0)

    @property
    def pending(self) -> int:
        """Requests queued and not yet taken into a batch (Triton's pending request count)."""
        return self._batcher.pending

    def stop(self) -> None:
        """Stop the batching thread. Requests still queued fail with Stopped instead of hanging, and
        so does every submit() until start() runs again: the servers may still be delivering
        requests while they shut down, and those must get an answer (503, UNAVAILABLE) at once."""
        self._ready = False
        self._batcher.stop()
        if self.fallback is not None:
            self.fallback.backup.stop()
        if self.pool is not None:
            self.pool.stop()  # kept: its run() answers Stopped until start() starts a new one

    def _warmup_inputs(self, rows: int) -> dict[str, np.ndarray]:
        return example_inputs(self.config, rows, WARMUP_DYNAMIC_DIM)

    # -- requests ---------------------------------------------------------------------------

    def submit(self, inputs: dict[str, np.ndarray], inline: bool = False,
               timeout_s: float | None = None) -> concurrent.futures.Future:
        """Validate now (RequestError), queue (Overloaded when full, Stopped after stop()); the
        future gets this request's own output rows, or RequestTimeout once it has been queued
        longer than `timeout_s` (default config.timeout_s): it is then dropped, not computed.

        With `inline`, a tiny model (self.inline) whose engine is idle runs the request on this
        thread and returns a finished future. Callers that know other requests are about to
        arrive (the server's event loop) pass False so that those can share a batch.
        """
        try:
            inputs = self._complete(inputs)
            rows = self._validate(inputs, self.max_rows, finite=False)
        except RequestError:
            self.metrics.record_failure(OTHER)
            raise
        if self.fallback is not None:  # the burst fallback: the backup while the primary's queue is too long
            return self.fallback.submit(inputs, rows, inline, timeout_s)
        return self._submit(inputs, rows, inline, timeout_s)

    def _submit(self, inputs: dict[str, np.ndarray], rows: int, inline: bool,
                timeout_s: float | None) -> concurrent.futures.Future:
        inline = inline and self.inline and (self.pool is None or self.pool.idle_count > 0)  # never wait on a restart
        return self._batcher.submit(inputs, rows, inline, timeout_s)

    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """submit() and wait up to config.timeout_s."""
        return self.result(self.submit(inputs), self.config.timeout_s)

    @staticmethod
    def result(future: concurrent.futures.Future, wait_s: float) -> dict[str, np.ndarray]:
        """The future's outputs, waiting up to wait_s; then RequestTimeout, and the request is
        abandoned: dropped if still queued, counted a failure if running (batcher.abandon)."""
        try:
            return future.result(timeout=wait_s)
        except concurrent.futures.TimeoutError:
            message = f"not answered within {wait_s:.3g}s"
            if abandon(future, message):
                raise RequestTimeout(message) from None
            return future.result()  # it finished as the wait ended

    def run_batch(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run any number of rows directly in chunks of max_batch_size, bypassing the queue
        (offline pyfunc predict on big inputs)."""
        inputs = self._complete(inputs)
        rows = self._validate(inputs, None, finite=True)
        chunks = []
        for start in range(0, rows, self.max_rows):
            began = time.perf_counter_ns()
            chunks.append(self._run(self._layout.take(inputs, start, start + self.max_rows)))
            self.metrics.record_execution(min(self.max_rows, rows - start), 1, 0, time.perf_counter_ns() - began)
        return layout.join(chunks, self._layout.outputs)

    def _complete(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The request with the constant inputs it left out (runtime.json `value`) filled in."""
        if not isinstance(inputs, dict) or not self._layout.constants:
            return inputs
        return {**{k: v for k, v in self._layout.constants.items() if k not in inputs}, **inputs}

    def _validate(self, inputs: dict[str, np.ndarray], max_rows: int | None, finite: bool) -> int:
        """Check names, dtypes, ranks, fixed dims and row counts (on each input's batch axis) against the
        config, and with `finite`
        that float inputs are finite; the row count. run_batch (pyfunc's predict) checks finiteness: an
        INT8 model answers NaN with plausible logits. The servers' submit() does not: like Triton they
        pass binary tensors to the model as they are (perf_analyzer's random data holds NaN bit
        patterns), and JSON, which cannot carry NaN or Inf, is refused in the codec."""
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
            if finite and array.dtype.kind == "f" and not np.isfinite(array).all():
                raise RequestError(f"input {name!r} holds NaN or infinite values")
            self.config.check_shape(name, list(array.shape), None)  # rows: together, below
            if spec.batch_axis is not None:
                rows.add(array.shape[spec.batch_axis])
        if len(rows) > 1:
            raise RequestError(f"inputs disagree on the number of rows (on their batch axes): {sorted(rows)}")
        (n,) = rows or {1}
        if n < 1:
            raise RequestError("a request needs at least one row")
        if self._fixed_batch and n % self._fixed_batch:
            raise RequestError(f"this model takes batches of exactly {self._fixed_batch} rows, got {n}")
        if max_rows is not None and n > max_rows:
            raise RequestError(f"{n} rows exceed max_batch_size {max_rows}")
        if pad_length(inputs, self.config.pad) == 0:
            raise RequestError(f"padded inputs {sorted(self.config.pad)} need at least one position on axis 1")
        return n

    def _run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self._graph_batches.run(self._run_exact, inputs)

    def _run_exact(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One run on a worker instance, else on the current session (looked up per call: _tune may replace it)."""
        if self.pool is not None:
            return self.pool.run(inputs)
        if self._session is None:
            raise Stopped("runtime stopped")
        return dict(zip(self._output_names, self._session.run(self._output_names, inputs)))


def default_instances(intra_op_threads: int, gpu: bool) -> int:
    """On a GPU one instance, as Triton's default (one per GPU); on the CPU usable cores over the session's
    intra-op threads, at least 1, so the instances' threads fill the cores once."""
    return 1 if gpu else max(1, usable_cores() // intra_op_threads)


def _settings(config: ServingConfig, runtime: Engine) -> tuple[EngineSettings | None, bool]:
    """The settings to start from, and whether start-up still has to choose the thread count:
    runtime.json's as recorded for this runtime, unless this host has fewer usable cores than they name
    (then all usable cores, chosen again, with one log line); without any, the runtime's defaults (all
    usable cores), chosen at start."""
    cores = usable_cores()
    recorded = config.session if isinstance(config.session, runtime.settings) else None
    if recorded is None:
        return None, True
    if recorded.threads > cores:
        log.warning("%s: runtime.json records %d intra-op threads, chosen where the speed gates measured, but this "
                    "host has %d usable cores: choosing the thread count again", config.name, recorded.threads, cores)
        return recorded.with_threads(cores), True
    return recorded, False


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


def _drift_warning(gated_with: dict[str, str]) -> str | None:
    """Why the bundle's gate verdicts may not hold under this process's libraries (another ONNX Runtime
    quantizes, computes and costs differently), or None when they match or none were recorded."""
    differ = versions.drift(gated_with)
    if not differ:
        return None
    return (f"this runtime differs from the one the bundle's gates ran on: {', '.join(differ)}; its accuracy and "
            "speed may not hold here: re-check it with `temper validate RECIPE --model models:/NAME@ALIAS`")
