"""ONNX Runtime's CPU thread choice (all usable cores or one, by a batch-1 timing), made here so that the
speed gates make it exactly as serving does, and the interleaved batch-1 timing it and start-up use.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from temper.artifacts.engines.base import Session
from temper.artifacts.engines.onnxruntime import SessionSettings, graphed, open_session

TIMING_RUNS = 21  # batch-1 runs per session timed at start-up (median), fewer for slow models
TIMING_BUDGET_S = 0.25  # per session, after which timing stops once MIN_TIMING_RUNS ran
MIN_TIMING_RUNS = 3


def choose_threads(model: Path, session: Session, settings: SessionSettings, inputs: dict[str, np.ndarray],
                   providers: list[str]) -> tuple[Session, SessionSettings, list[float]]:
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
    sessions = [session, graphed(open_session(model, one, providers), one)]
    times = median_runs_s(sessions, inputs)
    return (sessions[1], one, times) if times[1] < times[0] else (session, settings, times)


def median_runs_s(sessions: list[Session], inputs: dict[str, np.ndarray]) -> list[float]:
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
