"""Engine choice: which ONNX Runtime execution provider runs the model, and how its sessions are built.

The Runtime asks for one session on the best engine this host really runs (TensorRT, else CUDA,
else CPU) and, at start-up, times candidate sessions to keep the faster. Both live here so that
everything that depends on the host's accelerators and ONNX Runtime's provider options is in
one place, apart from batching and request handling.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import platformdirs

log = logging.getLogger("temper.serving")

TENSORRT = "TensorrtExecutionProvider"
CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"
TIMING_RUNS = 21  # batch-1 runs per session timed at start-up (median), fewer for slow models
TIMING_BUDGET_S = 0.25  # per session, after which timing stops once MIN_TIMING_RUNS ran
MIN_TIMING_RUNS = 3
Providers = list[str | tuple[str, dict[str, str]]]  # an InferenceSession provider chain


def engine_cache() -> Path:
    """Where TensorRT engines built on this host are kept: $TEMPER_ENGINE_CACHE, else `engines` in
    the user cache folder platformdirs names (~/.cache/temper/engines on Linux, $XDG_CACHE_HOME
    honoured), the same rule as the pipeline's step cache, so one setting moves both."""
    override = os.environ.get("TEMPER_ENGINE_CACHE")
    return Path(override) if override else platformdirs.user_cache_path("temper", appauthor=False) / "engines"


def load(model: Path, providers: list[str] | None, threads: int, name: str) -> tuple[ort.InferenceSession, str]:
    """One session on the best engine this host really runs, and that engine's name (tensorrt,
    cuda or cpu). `providers` None: TensorRT, else CUDA, else CPU, whichever are available.

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
    session = open_session(model, chain, threads)
    used = session.get_providers()
    engine = {TENSORRT: "tensorrt", CUDA: "cuda"}.get(used[0] if used else CPU, "cpu")
    if providers[0] != CPU and used[0] != providers[0]:
        log.warning("%s: %s requested but the session runs on %s", name, providers[0], used)
    log.info("%s: engine=%s providers=%s intra_op_threads=%d", name, engine, used, threads)
    return session, engine


def open_session(model: Path, chain: Providers, threads: int) -> ort.InferenceSession:
    """A session on `chain` with `threads` intra-op threads that sleep, not spin, when idle.

    Spinning intra-op threads burn every core even when idle (measured 180-200% CPU at
    any load on 2 cores), starving the HTTP threads that feed the batcher. One
    inference thread runs back-to-back batches under load, so spinning buys little.
    """
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(model), options, providers=chain)


def median_runs_s(sessions: list[ort.InferenceSession], inputs: dict[str, np.ndarray]) -> list[float]:
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
