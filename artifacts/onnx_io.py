"""Small helpers around ONNX files and ONNX Runtime sessions that several steps share."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from google.protobuf.message import EncodeError

from temper.artifacts.errors import OptionError

Batch = dict[str, np.ndarray]


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
    options.log_severity_level = 3
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


def fit_batch(model: onnx.ModelProto, batch: Batch) -> Batch:
    """Feed for `model` from `batch`: keep its inputs, cut a fixed leading (batch) dim down to size.

    Other fixed dims must already match; a mismatch is reported, never silently padded.
    """
    feed: Batch = {}
    for name, shape in dims(model).items():
        if name not in batch:
            raise OptionError(name, f"model input '{name}' is not in the data (data has {', '.join(sorted(batch))})")
        array = batch[name]
        if shape and isinstance(shape[0], int) and shape[0] > 0 and array.shape[0] > shape[0]:
            array = array[: shape[0]]
        for axis, want in enumerate(shape):
            if isinstance(want, int) and want > 0 and (axis >= array.ndim or array.shape[axis] != want):
                raise OptionError(name, f"data has shape {list(array.shape)} but the model wants {shape}")
        feed[name] = array
    return feed


def run(path: Path, batch: Batch) -> list[np.ndarray]:
    """Run one batch on CPU, adapting the batch to fixed input dims."""
    sess = session(path)
    return sess.run(None, fit_batch(load_structure(path), batch))
