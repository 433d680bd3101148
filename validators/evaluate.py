"""Run a model over a whole evaluation set: the outputs every accuracy and fidelity gate reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import numpy as np
import onnx

from temper.artifacts.core.host import profile, usable_cores
from temper.artifacts.core.layout import AXIS0, Layout
from temper.artifacts.core.onnx_io import fingerprint, fit_batch, fixed_batch, load_structure
from temper.artifacts.engines.onnxruntime import SessionSettings, open_session
from temper.artifacts.engines.providers import CPU, Provider
from temper.artifacts.formats.integrity import content_digests
from temper.validators.throughput import session_for


class Kept(Protocol):
    """Where outputs are kept between calls and runs (pipeline.cache.OutputStore), keyed by what they
    depend on."""

    def get(self, parts: dict[str, Any]) -> dict[str, np.ndarray] | None: ...

    def put(self, parts: dict[str, Any], outputs: dict[str, np.ndarray]) -> None: ...


def predict(path: Path, features: dict[str, np.ndarray], batch_size: int,
            layout: Layout = AXIS0, provider: Provider = "cpu", kept: Kept | None = None) -> dict[str, np.ndarray]:
    """Every output of the model at `path` over every row of `features` (samples first), run on `provider`
    (a row of artifacts.engines.providers; ONNX Runtime's CPU by default) in batches laid out by `layout`,
    samples first again. On another provider the session is the one the speed gates measure there
    (throughput.session_for): a pair is gated on the outputs of the provider that would serve it.
    With `kept`, outputs computed before for the same model bytes, data, batching, provider and host
    are read back instead (the baseline's: `check`, the fallback's scorer and the gates all need them).

    A model with a fixed batch dim (a fixed-shape candidate) runs in chunks of exactly that
    size; its last partial chunk is padded with copies of the last row and the padded rows'
    outputs are dropped, so every candidate is scored on the same rows as the baseline.
    Float16 outputs come back as float32 so metrics compare like with like. The session is built
    from the same settings serving starts from (artifacts/engines/onnxruntime.py), graph optimizations included,
    so the outputs the gates score are the outputs the served model gives.
    """
    model = load_structure(path)
    parts = _depends_on(path, model, features, batch_size, layout, provider) if kept is not None else {}
    if kept is not None and (found := kept.get(parts)) is not None:
        return found
    outputs = _predict(path, model, features, batch_size, layout, provider)
    if kept is not None:
        kept.put(parts, outputs)
    return outputs


def _depends_on(path: Path, model: onnx.ModelProto, features: dict[str, np.ndarray], batch_size: int,
                layout: Layout, provider: Provider) -> dict[str, Any]:
    """What a model's outputs depend on: its bytes (external data included), the rows, the batching, the
    provider, and the host's ISA, threads and runtimes (kernels and their order of sums differ)."""
    host = profile()
    return {"model": content_digests(path, model), "features": fingerprint([features]), "batch_size": batch_size,
            "layout": [dict(layout.inputs), dict(layout.outputs), fingerprint([dict(layout.constants)])],
            "engine": provider,  # the cache key keeps its first name
            "host": [*host.kernels(), host.onnxruntime, host.openvino]}


def _predict(path: Path, model: onnx.ModelProto, features: dict[str, np.ndarray], batch_size: int,
             layout: Layout, provider: Provider) -> dict[str, np.ndarray]:
    sess = (open_session(path, SessionSettings(intra_op_threads=usable_cores()), [CPU]) if provider == "cpu"
            else session_for(path, provider))
    names = [o.name for o in sess.get_outputs()]
    fixed = fixed_batch(model, layout)
    step = fixed or batch_size
    rows = len(next(iter(features.values())))
    if rows == 0:
        raise ValueError("no rows to evaluate")
    parts: dict[str, list[np.ndarray]] = {name: [] for name in names}
    for start in range(0, rows, step):
        chunk = {k: v[start : start + step] for k, v in features.items()}
        real = min(step, rows - start)
        if fixed and real < fixed:
            chunk = {k: _pad(v, fixed) for k, v in chunk.items()}
        outputs = layout.samples(dict(zip(names, sess.run(names, fit_batch(model, layout.feed(chunk), layout)))))
        for name, out in outputs.items():
            parts[name].append(out[:real])
    return {name: _widen(np.concatenate(chunks)) for name, chunks in parts.items()}


def _pad(array: np.ndarray, size: int) -> np.ndarray:
    """Repeat the last row: real values stay in range (token ids, masks), unlike zeros."""
    return np.concatenate([array, np.repeat(array[-1:], size - len(array), axis=0)])


def _widen(array: np.ndarray) -> np.ndarray:
    return array.astype(np.float32) if array.dtype == np.float16 else array

