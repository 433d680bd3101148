"""Small helpers around ONNX files and ONNX Runtime sessions that several steps share."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from google.protobuf.message import EncodeError

from temper.artifacts.core import native_logs
from temper.artifacts.core.errors import OptionError
from temper.artifacts.core.layout import AXIS0, Layout

Batch = dict[str, np.ndarray]  # a feed in the model's layout: rows on each input's batch axis, constants included


def load_structure(path: Path) -> onnx.ModelProto:
    """The graph without weight data: enough to read names, shapes and node lists cheaply."""
    return onnx.load(str(path), load_external_data=False)


def save(model: onnx.ModelProto, path: Path) -> None:
    """Save, switching to external data past protobuf's 2 GB limit."""
    try:
        large = model.ByteSize() > 1_800_000_000
    except EncodeError:  # protobuf refuses to even size a message past 2 GB
        large = True
    onnx.save_model(model, str(path), save_as_external_data=large, location=path.name + ".data" if large else None)


def session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = native_logs.severity()
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def dims(model: onnx.ModelProto) -> dict[str, list[int | str | None]]:
    """Graph inputs (not initializers) to their dims: int, symbolic name, or None when unknown."""
    initializers = {i.name for i in model.graph.initializer}
    out: dict[str, list[int | str | None]] = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        out[value.name] = [
            d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
            for d in value.type.tensor_type.shape.dim
        ]
    return out


def fixed_batch(model: onnx.ModelProto, layout: Layout = AXIS0) -> int | None:
    """The batch dim the model's inputs fix (on each one's batch axis in `layout`), the smallest where they
    differ; None when it is symbolic (any batch runs)."""
    sizes = []
    for name, shape in dims(model).items():
        axis = layout.inputs.get(name, 0)
        dim = shape[axis] if axis is not None and axis < len(shape) else None
        if isinstance(dim, int) and dim > 0:
            sizes.append(dim)
    return min(sizes) if sizes else None


def fit_batch(model: onnx.ModelProto, batch: Batch, layout: Layout = AXIS0) -> Batch:
    """Feed for `model` from `batch`: keep its inputs, cut a fixed batch dim (on each input's batch axis
    in `layout`, default 0) down to size.

    Other fixed dims must already match; a mismatch is reported, never silently padded.
    """
    feed: Batch = {}
    for name, shape in dims(model).items():
        if name not in batch:
            raise OptionError(name, f"model input '{name}' is not in the data (data has {', '.join(sorted(batch))})")
        array, lead = batch[name], layout.inputs.get(name, 0)
        if lead is not None and lead < len(shape) and array.ndim > lead:
            fixed = shape[lead]
            if isinstance(fixed, int) and 0 < fixed < array.shape[lead]:
                array = array[(slice(None),) * lead + (slice(0, fixed),)]
        for axis, want in enumerate(shape):
            if isinstance(want, int) and want > 0 and (axis >= array.ndim or array.shape[axis] != want):
                raise OptionError(name, f"data has shape {list(array.shape)} but the model wants {shape}")
        feed[name] = array
    return feed


def run(path: Path, batch: Batch, layout: Layout = AXIS0) -> list[np.ndarray]:
    """Run one batch on CPU, adapting the batch to fixed input dims."""
    sess = session(path)
    return sess.run(None, fit_batch(load_structure(path), batch, layout))


def fingerprint(batches: list[Batch]) -> str:
    """A digest of batches' names, dtypes, shapes and values: what a cached result computed from them keys on."""
    digest = hashlib.sha256()
    for batch in batches:
        for name in sorted(batch):
            digest.update(f"{name}:{batch[name].dtype}:{batch[name].shape}".encode())
            digest.update(np.ascontiguousarray(batch[name]).tobytes())
    return digest.hexdigest()
