"""Batch axes: which axis of each tensor holds a batch's rows, and moving rows between the data's
layout and the model's.

Data (files, the arrays the gates read, the outputs metrics score) holds one row per sample, rows
first. A model may hold its rows on another axis (Silero VAD's state is [2, batch, 128]), and an input
may have no batch axis at all: a constant such as a sample rate, one tensor for every row of a batch.
A Layout names, per input and output, the axis that holds the rows (None: no axis does) and the
constant inputs' values; the pipeline forms every batch with it, and the serving batcher joins and
splits requests with it. Shipped inside every MLflow model: numpy only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

Arrays = dict[str, np.ndarray]
Axes = Mapping[str, int | None]


def default_axes(shapes: Mapping[str, Sequence[int | str | None]],
                 given: Mapping[str, int | None] | None = None) -> dict[str, int | None]:
    """Each input's batch axis, where `given` does not name it: the axis named like the first batched
    input's batch dim (its axis 0 unless given), else 0; a rank-0 input has none."""
    given = given or {}
    axes: dict[str, int | None] = {}
    anchored, batch_dim = False, None
    for name, shape in shapes.items():
        dims = list(shape)
        if name in given:
            axis = given[name]
        elif not dims:
            axis = None
        elif anchored and isinstance(batch_dim, str) and batch_dim in dims:
            axis = dims.index(batch_dim)
        else:
            axis = 0
        if axis is not None and not anchored:
            anchored, batch_dim = True, dims[axis]
        axes[name] = axis
    return axes


def rows(arrays: Mapping[str, np.ndarray], axes: Axes) -> int:
    """The rows a batch holds: the length of its first batched tensor's batch axis."""
    for name, array in arrays.items():
        axis = axes.get(name, 0)
        if axis is not None and array.ndim > axis:
            return int(array.shape[axis])
    raise ValueError(f"no tensor of {sorted(arrays)} has a batch axis")


def take(arrays: Mapping[str, np.ndarray], axes: Axes, start: int, stop: int) -> Arrays:
    """Rows start:stop of every batched tensor; the others as they are."""
    out: Arrays = {}
    for name, array in arrays.items():
        axis = axes.get(name, 0)
        out[name] = array if axis is None else array[(slice(None),) * axis + (slice(start, stop),)]
    return out


def join(parts: Sequence[Mapping[str, np.ndarray]], axes: Axes) -> Arrays:
    """One batch from several: batched tensors concatenated along their batch axes, the others taken
    from the first part (the caller keeps only parts that agree on them together)."""
    if len(parts) == 1:
        return dict(parts[0])
    out: Arrays = {}
    for name, first in parts[0].items():
        axis = axes.get(name, 0)
        out[name] = first if axis is None else np.concatenate([p[name] for p in parts], axis=axis)
    return out


def split(arrays: Mapping[str, np.ndarray], axes: Axes, counts: Sequence[int]) -> list[Arrays]:
    """`join` undone: each part's rows of every batched tensor (each part gets the others whole)."""
    parts: list[Arrays] = []
    offset = 0
    for count in counts:
        parts.append(take(arrays, axes, offset, offset + count))
        offset += count
    return parts


def to_axis(array: np.ndarray, axis: int | None) -> np.ndarray:
    """A rows-first array with its rows moved to `axis` (contiguous, as ONNX Runtime binds it)."""
    return array if not axis else np.ascontiguousarray(np.moveaxis(array, 0, axis))


def from_axis(array: np.ndarray, axis: int | None) -> np.ndarray:
    """`to_axis` undone: the rows on `axis` moved to the front."""
    return array if not axis else np.moveaxis(array, axis, 0)


@dataclass(frozen=True)
class Layout:
    """Where a model holds its rows: the batch axis of each input and output (None: not batched; a
    tensor not named: 0), and the inputs fed the same value in every batch."""

    inputs: Axes = field(default_factory=dict)
    outputs: Axes = field(default_factory=dict)
    constants: Mapping[str, np.ndarray] = field(default_factory=dict)

    def feed(self, data: Mapping[str, np.ndarray]) -> Arrays:
        """The model's feed from rows-first data: each input's rows on its batch axis, the constants added."""
        feed = {name: to_axis(np.asarray(array), self.inputs.get(name, 0))
                for name, array in data.items() if name not in self.constants}
        return {**feed, **self.constants}

    def samples(self, outputs: Mapping[str, np.ndarray]) -> Arrays:
        """Rows-first outputs: each output's batch axis moved to the front (an unbatched one as it is)."""
        return {name: from_axis(array, self.outputs.get(name, 0)) for name, array in outputs.items()}

    def rows(self, feed: Mapping[str, np.ndarray]) -> int:
        """The rows a feed in the model's layout holds."""
        return rows(feed, self.inputs)

    def take(self, feed: Mapping[str, np.ndarray], start: int, stop: int) -> Arrays:
        """Rows start:stop of a feed in the model's layout."""
        return take(feed, self.inputs, start, stop)

    def join(self, feeds: Sequence[Mapping[str, np.ndarray]]) -> Arrays:
        """Feeds in the model's layout as one."""
        return join(feeds, self.inputs)

    def with_outputs(self, outputs: Axes) -> Layout:
        return Layout(self.inputs, outputs, self.constants)


AXIS0 = Layout()  # every tensor's rows on axis 0, no constants: what a model without batch_axis settings takes
