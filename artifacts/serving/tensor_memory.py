"""Shared memory between the gateway and its inference workers: where a batch's tensors travel.

Each worker instance has two regions, anonymous memory files (memfd_create) that both processes map:
one for the inputs of the batch it runs, one for its outputs. The gateway creates both, sized from
the bundle (max batch rows of every tensor, dynamic dims at DYNAMIC_DIM_GUESS), and hands the file
descriptors to the worker when it starts it. A tensor crosses as bytes written once into a region;
over the control socket goes only a descriptor: per tensor its name, dtype, shape and offset (JSON,
a few hundred bytes). The reader makes numpy arrays over the mapping, no copy: ONNX Runtime reads a
batch's inputs where the gateway wrote them.

A region too small for a batch (a longer sequence than guessed) is grown by the side that writes
it, with ftruncate on the same file; the descriptor carries the region's size, and the reader maps
it again when that is larger than its mapping. No file descriptor moves after start-up.

Outputs are copied out of the output region by the gateway (one memcpy of the batch): the region
is that instance's next batch's, while the requests' answers are still being encoded.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Mapping

import numpy as np

from temper.artifacts.formats.bundle import ServingConfig, TensorSpec

ALIGN = 64  # every tensor starts on a cache line
DYNAMIC_DIM_GUESS = 128  # size a dynamic non-batch dim (a sequence length) takes in the initial size
MIN_BYTES = 64 * 1024

Descriptor = list[tuple[str, str, list[int], int]]  # (name, dtype, shape, offset) per tensor


class Region:
    """One shared memory file mapped in this process; `fd` is inherited by the other side."""

    def __init__(self, fd: int, size: int) -> None:
        self.fd = fd
        self.size = size
        self.map = mmap.mmap(fd, size)

    @classmethod
    def create(cls, name: str, size: int) -> Region:
        """A new region of `size` bytes (at least MIN_BYTES), not inherited by children unless passed."""
        fd = os.memfd_create(name, os.MFD_CLOEXEC)
        size = max(size, MIN_BYTES)
        os.ftruncate(fd, size)
        return cls(fd, size)

    def fit(self, size: int) -> None:
        """Make the region hold `size` bytes, growing the file (to twice what is asked, so that sizes
        creeping up do not grow it every batch) and mapping it again."""
        if size > self.size:
            os.ftruncate(self.fd, size * 2)
            self._remap(size * 2)

    def follow(self, size: int) -> None:
        """The other side grew the file to `size`: map it again."""
        if size > self.size:
            self._remap(size)

    def _remap(self, size: int) -> None:
        # The old map is not closed here: arrays made over it may still be alive; it closes with the last of them.
        self.map, self.size = mmap.mmap(self.fd, size), size

    def write(self, arrays: Mapping[str, np.ndarray]) -> Descriptor:
        """Copy `arrays` into the region, one after another at aligned offsets; their descriptor."""
        offsets, end = [], 0
        for array in arrays.values():
            offsets.append(end)
            end = _aligned(end + array.nbytes)
        self.fit(end)
        descriptor: Descriptor = []
        for (name, array), offset in zip(arrays.items(), offsets):
            view = np.ndarray(array.shape, array.dtype, buffer=self.map, offset=offset)
            view[...] = array
            descriptor.append((name, array.dtype.str, list(array.shape), offset))
        return descriptor

    def read(self, descriptor: Descriptor, size: int, copy: bool) -> dict[str, np.ndarray]:
        """The arrays `descriptor` names, as views of the region (copies with `copy`)."""
        self.follow(size)
        arrays = {}
        for name, dtype, shape, offset in descriptor:
            view = np.ndarray(shape, np.dtype(dtype), buffer=self.map, offset=offset)
            arrays[name] = view.copy() if copy else view
        return arrays

    def close(self) -> None:
        """Unmap (once no array over the map is left) and close the file; its memory is freed once the
        other side has closed it too."""
        try:
            self.map.close()
        except BufferError:  # arrays over it are alive: the map goes with the last of them
            pass
        os.close(self.fd)


def batch_bytes(specs: list[TensorSpec], rows: int) -> int:
    """Bytes a batch of `rows` rows of these tensors takes, dynamic non-batch dims counted as DYNAMIC_DIM_GUESS."""
    total = 0
    for spec in specs:
        elements = 1
        for axis, dim in enumerate(spec.shape):
            elements *= rows if axis == spec.batch_axis else (dim if dim > 0 else DYNAMIC_DIM_GUESS)
        total = _aligned(total + elements * np.dtype(spec.dtype).itemsize)
    return total


def regions_for(config: ServingConfig, rows: int, name: str) -> tuple[Region, Region]:
    """The (inputs, outputs) regions of one instance serving `config` in batches of up to `rows` rows."""
    return (Region.create(f"temper-{name}-in", batch_bytes(config.inputs, rows)),
            Region.create(f"temper-{name}-out", batch_bytes(config.outputs, rows)))


def _aligned(offset: int) -> int:
    return -(-offset // ALIGN) * ALIGN
