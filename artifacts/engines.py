"""Engine choice: which engine runs the model, and the thread choice.

A bundle selected on OpenVINO (runtime.json `engine`: openvino, openvino-bf16) runs on OpenVINO's
CPU plugin with the settings the gates measured, precision checked on the compiled model
(load_openvino). Otherwise the Runtime asks for one ONNX Runtime session on the best engine this
host really runs (TensorRT, else CUDA, else CPU); how every session is built (threads, spinning,
graph optimization, provider options) is artifacts/session.py's one definition. The thread choice
(all usable cores or one, by a batch-1 timing) lives here so that the speed gates make it exactly as
serving does.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

from temper.artifacts.openvino_session import OpenVinoSession, OpenVinoSettings, open_engine
from temper.artifacts.providers import BEST_FIRST, CPU, PROVIDERS, Provider, named
from temper.artifacts.session import SessionSettings, open_session

log = logging.getLogger("temper.serving")

TIMING_RUNS = 21  # batch-1 runs per session timed at start-up (median), fewer for slow models
TIMING_BUDGET_S = 0.25  # per session, after which timing stops once MIN_TIMING_RUNS ran
MIN_TIMING_RUNS = 3


def load(model: Path, providers: list[str] | None, settings: SessionSettings,
         name: str) -> tuple[ort.InferenceSession, Provider]:
    """One session on the best engine this host really runs, and that engine's name (tensorrt,
    cuda or cpu). `providers` None: TensorRT, else CUDA, else CPU, whichever are available.

    TensorRT goes through ONNX Runtime's TensorRT provider with its engine cache
    (artifacts/session.py), so the bundle stays portable across GPUs. Precision comes from the
    graph (FP16 casts, QDQ), as TensorRT 11 has no precision flags. A requested provider the
    session did not activate is logged, never silently reported as the engine.
    """
    available = ort.get_available_providers()
    if providers is None:
        providers = [PROVIDERS[p].ort for p in BEST_FIRST if p != "cpu" and PROVIDERS[p].ort in available] + [CPU]
    session = open_session(model, settings, providers)
    used = session.get_providers()
    engine = named(used[0] if used else CPU)
    if providers[0] != CPU and used[0] != providers[0]:
        log.warning("%s: %s requested but the session runs on %s", name, providers[0], used)
    log.info("%s: engine=%s providers=%s intra_op_threads=%d spinning=%s", name, engine, used,
             settings.intra_op_threads, settings.spinning)
    return session, engine


def load_openvino(model: Path, engine: Provider, recorded: OpenVinoSettings | None, cores: int,
                  name: str) -> OpenVinoSession:
    """The compiled model for a bundle selected on an OpenVINO row: the precision its row names, the
    threads, streams and performance hint runtime.json records (the speed gates' settings, searched or
    not; all usable cores when it records none, or more threads than this host has).
    EnvironmentProblem when openvino is absent or the compiled model computes in another precision."""
    precision = PROVIDERS[engine].precision
    assert precision is not None  # every OpenVINO row names its precision
    threads = cores if recorded is None or recorded.num_threads > cores else recorded.num_threads
    if recorded is None:
        session = open_engine(model, precision, threads)
    else:
        session = open_engine(model, precision, threads, recorded.num_streams, recorded.performance_hint)
    log.info("%s: engine=%s inference_precision=%s threads=%d streams=%d hint=%s", name, engine,
             session.settings.inference_precision, session.settings.num_threads, session.settings.num_streams,
             session.settings.performance_hint)
    return session


def choose_threads(model: Path, session: ort.InferenceSession, settings: SessionSettings, inputs: dict[str, np.ndarray],
                   providers: list[str]) -> tuple[ort.InferenceSession, SessionSettings, list[float]]:
    """The CPU engine's thread choice, made the same way wherever a model is measured or served: time
    batch-1 `inputs` on `session` (built from `settings`, all usable cores) and on a one-thread
    session with otherwise equal settings, and keep the faster. Returns the kept session, its settings
    and the median seconds of each session timed.

    Neither thread count wins everywhere: one thread gave the digits CNN +23% at 32 clients (no
    per-operator wake-up of sleeping threads) but halves a 2.7 ms CNN. Batch 1 is timed because that
    is what the difference shows on, and what an inline run executes.
    """
    if settings.intra_op_threads == 1:
        return session, settings, median_runs_s([session], inputs)
    one = settings.model_copy(update={"intra_op_threads": 1})
    sessions = [session, open_session(model, one, providers)]
    times = median_runs_s(sessions, inputs)
    return (sessions[1], one, times) if times[1] < times[0] else (session, settings, times)


def median_runs_s(sessions: list[ort.InferenceSession] | list[OpenVinoSession],
                  inputs: dict[str, np.ndarray]) -> list[float]:
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
