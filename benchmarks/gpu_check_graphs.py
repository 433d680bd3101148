"""CUDA graphs off and on, for benchmarks/gpu_check.py: the model a run selected, opened through temper's engine
interface twice (its gated settings with `cuda_graph` false and true), timed in the gates' own interleaved
rounds at batch 1, 32 and 256 (samples/s of each, and on's speedup over off with its interval), and the two
sessions' outputs compared at each batch size (the gates' replay check runs too: a replay that differs stops
that batch size with its one line, recorded here).

On `--provider cpu` (the CI dry run) `cuda_graph: true` runs the same bound-buffer path without a graph, so
the code runs end to end here and the GPU call is never its first.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import numpy as np

from temper.artifacts import engines
from temper.artifacts.core.errors import StepFailed
from temper.artifacts.core.layout import AXIS0
from temper.artifacts.core.onnx_io import load_structure
from temper.artifacts.engines.providers import Provider
from temper.validators.rounds import ROUNDS, Bench, Timing, interleave
from temper.validators.speedup import estimate
from temper.validators.throughput import batch_of, random_inputs

BATCHES = [1, 32, 256]
CONFIDENCE = 0.95


def compare(model: Path, provider: str, recorded: dict[str, Any] | None, duration_s: float,
            warmup_s: float) -> dict[str, Any]:
    """Off and on at each of BATCHES: figures, speedup interval, outputs' largest difference, or the replay
    check's line where it failed."""
    row = cast(Provider, provider)
    runtime = engines.of(row)
    base = engines.parse(provider, recorded) or runtime.defaults(row)
    settings = {name: base.model_copy(update={"cuda_graph": on}) for name, on in (("off", False), ("on", True))}
    sessions = {name: runtime.open(model, row, value) for name, value in settings.items()}
    read_back = {name: runtime.settings_of(s).model_dump() for name, s in sessions.items()}
    structure = load_structure(model)
    sample = random_inputs(structure, max(BATCHES), {})
    paths = dict.fromkeys(sessions, (model, provider))
    timing = Timing(duration_s / ROUNDS, warmup_s, ROUNDS)
    found: dict[str, Any] = {"model": str(model), "provider": provider, "settings": read_back, "batches": {}}
    for size in BATCHES:
        feed = batch_of(structure, sample, size, AXIS0)
        off, on = (dict(zip([o.name for o in s.get_outputs()], s.run(None, feed))) for s in sessions.values())
        gap = max(float(np.max(np.abs(off[k].astype(np.float64) - on[k].astype(np.float64)))) for k in off)
        entry: dict[str, Any] = {"max_abs_difference": gap, "equal": all(np.array_equal(off[k], on[k]) for k in off)}
        try:
            bench = interleave(Bench(size, "off", {name: {} for name in sessions}), sessions, paths, sample, AXIS0,
                               timing, lambda *_: False)
        except StepFailed as exc:
            entry["replay_check"] = str(exc)
            found["batches"][str(size)] = entry
            continue
        up = estimate(bench.ratios("on"), CONFIDENCE)
        entry |= {"replay_check": "passed",
                  "off_samples_per_s": bench.figure("off").samples_per_s,
                  "on_samples_per_s": bench.figure("on").samples_per_s,
                  "speedup": up.ratio, "speedup_interval": None if up.low is None else [up.low, up.high],
                  "rounds": up.rounds, "load": bench.load.as_dict() if bench.load else None}
        found["batches"][str(size)] = entry
    return found
