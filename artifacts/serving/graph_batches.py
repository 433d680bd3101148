"""The batch sizes a CUDA-graph model is served at: powers of two up to max_batch_size, and max_batch_size.

With `cuda_graph` each input shape holds its own captured graph and its own device buffers
(artifacts/engines/cuda_graphs.py), and the dynamic batcher forms every row count from 1 to max_batch_size:
one graph per count would hold buffers for max_batch_size^2 / 2 rows (resnet18 at 64: about 1.2 GiB of
inputs alone) and capture 64 graphs at start. So `temper serve`, its workers and the pyfunc model pad a
batch to the next of these sizes (repeating its last row on each batch axis) and drop the padded rows from
the answer: about log2(max_batch_size) graphs, at most twice the largest batch's buffers. Rows are
independent, as the batcher already assumes when it joins requests; a batch-dependent model (runtime.json
`batch_dependent`) and a fixed batch dim are run as they come.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from temper.artifacts.core.layout import Arrays, Layout, take

Run = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


def sizes(max_rows: int) -> list[int]:
    """1, 2, 4, ... below max_rows, then max_rows."""
    found = [1 << power for power in range(max_rows.bit_length()) if 1 << power < max_rows]
    return [*found, max_rows]


class GraphBatches:
    """Pads each batch to the next served size before `run`, and cuts the answer back; a pass-through when off."""

    def __init__(self, layout: Layout, max_rows: int, on: bool) -> None:
        self.layout = layout
        self.sizes = sizes(max_rows) if on else []

    def run(self, run: Run, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if not self.sizes:
            return run(inputs)
        rows = self.layout.rows(inputs)
        size = next((s for s in self.sizes if s >= rows), rows)
        if size == rows:
            return run(inputs)
        return take(run(pad(inputs, self.layout, rows, size)), self.layout.outputs, 0, rows)


def pad(inputs: dict[str, np.ndarray], layout: Layout, rows: int, size: int) -> Arrays:
    """`inputs` with `size` rows on each batch axis, the last row repeated (never zeros: an all-zero attention
    mask or norm would put NaN in rows that are dropped, but computed)."""
    index = np.minimum(np.arange(size), rows - 1)
    out: Arrays = {}
    for name, array in inputs.items():
        axis = layout.inputs.get(name, 0)
        out[name] = array if axis is None or name in layout.constants else np.take(array, index, axis=axis)
    return out
