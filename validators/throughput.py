"""Throughput: warm-up, then timed calls for a fixed duration, on exactly the provider asked for.

A provider that ONNX Runtime does not activate is an error, never a quiet CPU number; so is an
OpenVINO engine that offers no device or computes in another precision than its row names. Inputs
are built (and on a GPU, copied to it) once before the timed loop, so the loop times the model.
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import psutil

from temper.artifacts import engines
from temper.artifacts.core.errors import OptionError
from temper.artifacts.core.host import HostProfile, usable_cores
from temper.artifacts.core.layout import AXIS0, Layout, default_axes
from temper.artifacts.core.onnx_io import dims, fixed_batch, load_structure
from temper.artifacts.engines import EngineSettings, Session, gpu_memory
from temper.artifacts.engines.onnxruntime import SessionSettings
from temper.artifacts.engines.providers import CPU, PROVIDERS, Provider
from temper.artifacts.engines.threads import choose_threads

_PERCENTILES = (50, 90, 95, 99)


@dataclass(frozen=True)
class Measurement:
    provider: str  # a row of artifacts.engines.providers: "cpu", "cuda", "tensorrt", "openvino", "openvino-bf16"
    batch_size: int
    runs: int  # timed inference calls
    samples: int  # runs * batch_size: what the count claims
    seconds: float  # timed wall time: the sum of the per-call latencies
    samples_per_s: float
    latency_ms: dict[str, float]  # p50, p90, p95, p99 of one call
    peak_rss_mb: float  # MiB; the whole process's RSS (not this model's alone), highest value sampled
    gpu_mem_mb: float | None  # on a GPU row, the MiB this process holds there, highest sampled; None: no GPU row
    rounds: int = 1  # interleaved slices this figure is the median of
    spread_pct: float | None = None  # (fastest - slowest slice) / median, in %: the noise across rounds
    load: dict[str, float | None] | None = None  # artifacts.core.host.Load while it was measured
    session: dict[str, Any] | None = None  # SessionSettings / OpenVinoSettings the session really ran with
    threads: int | None = None  # the CPU threads one call ran on, read back from the session

    def as_dict(self) -> dict:
        return asdict(self)


def require_available(provider: Provider, host: HostProfile | None = None) -> None:
    """Fail early (before any model is built) when this host cannot offer `provider` at all: its runtime says
    why (an ONNX Runtime provider this onnxruntime lacks, OpenVINO absent or without a CPU device, a BF16 row
    on a CPU whose profile reports no native BF16)."""
    engines.of(provider).available(provider, host)


def default_settings() -> SessionSettings:
    """The settings a model starts from on ONNX Runtime's CPU: all usable cores (CPU affinity and the
    container's quota), idle threads sleeping, every graph optimization (artifacts/engines/onnxruntime.py)."""
    return SessionSettings(intra_op_threads=usable_cores())


def engine_defaults(provider: Provider) -> EngineSettings:
    """The settings a model starts from on `provider`, as its runtime defines them for this host."""
    return engines.of(provider).defaults(provider)


def session_for(path: Path, provider: Provider, settings: EngineSettings | None = None, *,
                asked: bool = False) -> Session:
    """A session built from `settings` (engine_defaults(provider)) whose graph runs on `provider`, checked
    against what the session itself reports (onnxruntime-gpu falls back to the CPU silently; OpenVINO may
    compute in another precision than asked). `asked`: the caller already asked require_available."""
    if not asked:
        require_available(provider)
    engine = engines.of(provider)
    return engine.open(path, provider, settings or engine.defaults(provider))


def tuned_session(path: Path, provider: Provider, sample: dict[str, np.ndarray],
                  layout: Layout = AXIS0) -> Session:
    """The session `path` is measured with on `provider`, threads chosen once for this model exactly as
    the serving runtime chooses them on ONNX Runtime's CPU (artifacts.engines.threads.choose_threads,
    batch-1 rows of `sample`); on any other row its runtime's defaults, as serving uses there. A bundle
    records the kept session's settings (Measurement.session), so serving runs what was measured."""
    session = session_for(path, provider)
    if provider != "cpu":
        return session
    structure = load_structure(path)
    rows = fixed_batch(structure, layout) or 1
    kept, _, _ = choose_threads(path, session, default_settings(), batch_of(structure, sample, rows, layout),
                                [CPU])
    return kept


def recorded_settings(session: Session, provider: Provider) -> dict[str, Any]:
    """The settings a session really runs with, read back from it, as report.json records them."""
    return engines.of(provider).settings_of(session).model_dump()


def fits_in_memory(sample: dict[str, np.ndarray], batch_size: int) -> str | None:
    """None when one batch of `batch_size` rows like `sample`'s fits comfortably in the memory this
    host has free, else why not: a batch far too large is a typo, and numpy's MemoryError a puzzle."""
    row = sum(np.asarray(v)[:1].nbytes for v in sample.values() if np.ndim(v))  # a scalar is not per row
    need, free = row * batch_size, psutil.virtual_memory().available
    if need * 4 > free:  # the batch, its copy in the session, outputs and activations: keep a margin
        return (f"batch size {batch_size:,} needs {need / 2**30:,.1f} GiB for its inputs alone; this host has "
                f"{free / 2**30:,.1f} GiB free: use a smaller batch size")
    return None


def batch_of(model: onnx.ModelProto, sample: dict[str, np.ndarray], batch_size: int,
             layout: Layout = AXIS0) -> dict[str, np.ndarray]:
    """One call's inputs: real rows from `sample` (samples first), repeated in order when it has fewer than
    `batch_size`, laid out by `layout` (rows on each input's batch axis, its constants added)."""
    rows: dict[str, np.ndarray] = {}
    shapes = dims(model)
    if shapes and not any(shapes.values()) and batch_size != 1:  # what would the other rows be?
        raise ValueError(f"every input of the model is a scalar (no batch dim), so batch size {batch_size} cannot "
                         "run; measure batch size 1")
    for name, shape in shapes.items():
        axis = layout.inputs.get(name, 0)
        if name in layout.constants:
            continue
        if name not in sample:
            raise ValueError(f"model input '{name}' is not in the sample (sample has {', '.join(sorted(sample))})")
        given = np.asarray(sample[name])
        if axis is None or not shape:  # a scalar input has no batch dim
            rows[name] = given
            continue
        lead = shape[axis] if axis < len(shape) else None
        if isinstance(lead, int) and lead > 0 and lead != batch_size:
            raise ValueError(
                f"input '{name}' has its batch dim fixed to {lead}, so batch size {batch_size} cannot run; "
                "export the model with a dynamic batch dim"
            )
        if len(given) == 0:
            raise ValueError(f"the sample for input '{name}' has no rows")
        rows[name] = given[np.arange(batch_size) % len(given)]
    return layout.feed(rows)


def graph_layout(model: onnx.ModelProto, values: dict[str, float] | None = None) -> Layout:
    """The layout of a model without a recipe: each input's batch axis the one named like the first
    input's batch dim, else 0 (a scalar has none); `values` the constant inputs (`temper bench --value`)."""
    types = {v.name: v.type.tensor_type.elem_type for v in model.graph.input}
    given = {name: None for name in values or {}}
    constants = {name: np.asarray(value, dtype=onnx.helper.tensor_dtype_to_np_dtype(types[name]))
                 for name, value in (values or {}).items() if name in types}
    return Layout(default_axes(dims(model), given), constants=constants)


def random_inputs(model: onnx.ModelProto, rows: int, sizes: dict[str, int],
                  layout: Layout | None = None) -> dict[str, np.ndarray]:
    """Random inputs for a benchmark without data, samples first: `rows` of them for each input with a batch
    axis in `layout` (default graph_layout's), `sizes` for symbolic dims; an unbatched input gets one
    tensor, a constant none.

    Integer inputs get values in [0, 100): fine for speed, not for token-id models whose cost
    depends on the ids (benchmark those on real data via `temper run`). Keys of `sizes` are dim
    names, or `input[axis]` for an unnamed dim; a key naming no such dim is refused, not ignored.
    Raises OptionError keyed by `--dim` or `MODEL`.
    """
    rng = np.random.default_rng(0)
    inputs = dims(model)
    for value in model.graph.input:  # dims() reads a sequence or map input as a scalar: refuse it by name
        kind = (value.type.WhichOneof("value") or "untyped").removesuffix("_type")
        if kind != "tensor" and value.name in inputs:
            raise OptionError("MODEL", f"input '{value.name}' is a {kind}, not a tensor: temper bench fills tensor "
                                       "inputs only, so it cannot measure this model")
    layout = layout or graph_layout(model)
    types = {v.name: v.type.tensor_type.elem_type for v in model.graph.input}
    shapes: dict[str, list[int]] = {}
    symbolic: list[str] = []  # the dims --dim sizes, in the model's order
    batch: set[str] = set()  # named batch dims: --batch-sizes sizes those
    for name, shape in inputs.items():
        if name in layout.constants:
            continue
        batch_axis = layout.inputs.get(name, 0)
        shapes[name] = [] if batch_axis is None else [rows]
        for axis, dim in enumerate(shape):
            key = dim if isinstance(dim, str) else f"{name}[{axis}]"
            fixed = isinstance(dim, int) and dim > 0
            if axis == batch_axis:
                if not fixed:
                    batch.add(key)
            elif fixed:
                shapes[name].append(dim)  # type: ignore[arg-type]
            else:
                shapes[name].append(sizes.get(key, 0))
                if key not in symbolic:
                    symbolic.append(key)
    for key in sizes:
        if key in batch and key not in symbolic:
            raise OptionError("--dim", f"'{key}' is the batch dim: give its sizes with --batch-sizes")
        if key not in symbolic:
            known = ", ".join(symbolic) or "none, every other dim is fixed"
            raise OptionError("--dim", f"'{key}' is not a symbolic dim of the model; its symbolic dims: {known}")
    missing = [key for key in symbolic if key not in sizes]
    if missing:
        given = ", ".join(f"{k}={v}" for k, v in sizes.items()) or "none"
        raise OptionError("--dim", f"symbolic dims need a size: {', '.join(missing)} "
                                   f"(give --dim NAME=SIZE; given: {given})")
    feed: dict[str, np.ndarray] = {}
    for name, concrete in shapes.items():
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(types[name]))
        if dtype.kind == "f":
            feed[name] = rng.standard_normal(concrete).astype(dtype)
        elif dtype.kind in "iu":
            feed[name] = rng.integers(0, 100, concrete).astype(dtype)
        elif dtype.kind == "b":
            feed[name] = rng.integers(0, 2, concrete).astype(bool)
        else:
            raise OptionError("MODEL", f"input '{name}' has type {dtype}, which random data cannot fill: "
                                       "use `temper run` with real data")
    return feed


def measure(
    path: Path, sample: dict[str, np.ndarray], batch_size: int, provider: Provider, duration_s: float, warmup_s: float,
    session: Session | None = None, layout: Layout = AXIS0, feed: dict[str, np.ndarray] | None = None,
) -> Measurement:
    """Warm up for `warmup_s` (at least one call), then time calls until `duration_s` has elapsed.

    `feed`: the batch, when the caller built it already (interleaved slices: reading a model's graph to build
    it costs 0.16 s a slice for MiniLM's 90 MB of inline weights, more than a slice's timed calls).

    `session` lets a caller that measures the same model repeatedly (interleaved slices) create
    it once (the gates and `temper bench` pass tuned_session's); without it, default_settings().
    The figure records the settings read back from the session itself. RSS is read during warm-up and after
    the timed loop, never inside it: reading it is a syscall the loop would otherwise time. ORT's
    arenas keep what a call allocated, so steady state is what the reads see.
    """
    feed = feed if feed is not None else batch_of(load_structure(path), sample, batch_size, layout)
    session = session or session_for(path, provider)
    call = engines.of(provider).bound_call(session, feed, provider)
    gpu = PROVIDERS[provider].gpu

    peak = _rss_mb()
    warm_until = time.perf_counter() + warmup_s
    while True:
        call()
        peak = max(peak, _rss_mb())
        if time.perf_counter() >= warm_until:
            break

    latencies: list[float] = []
    start = now = time.perf_counter()
    end = start + duration_s
    while now < end:
        call()
        after = time.perf_counter()
        latencies.append(after - now)
        now = after
    peak = max(peak, _rss_mb())
    gpu_mb = gpu_memory.used_mb([os.getpid()]) if gpu else None  # the arena keeps what a call took: read once

    seconds, runs = now - start, len(latencies)
    quantiles = np.percentile(np.array(latencies) * 1e3, _PERCENTILES)
    return Measurement(
        provider=provider,
        batch_size=batch_size,
        runs=runs,
        samples=runs * batch_size,
        seconds=seconds,
        samples_per_s=runs * batch_size / seconds,
        latency_ms={f"p{p}": float(q) for p, q in zip(_PERCENTILES, quantiles)},
        peak_rss_mb=peak,
        gpu_mem_mb=gpu_mb,
        session=recorded_settings(session, provider),
        threads=engines.of(provider).settings_of(session).threads,
    )


def _rss_mb() -> float:
    """Resident set size of this whole process in MiB, through psutil so it works beyond Linux's /proc."""
    return _process(os.getpid()).memory_info().rss / 2**20


@functools.cache
def _process(pid: int) -> psutil.Process:
    """psutil's handle on `pid`, made once: keyed by PID so a forked child never reads its parent."""
    return psutil.Process(pid)
