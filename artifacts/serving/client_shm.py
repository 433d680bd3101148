"""Triton's system shared-memory extension: regions of POSIX shared memory a local client registers,
so that tensors cross between it and `temper serve` without being sent over the socket.

A client creates an object under /dev/shm (tritonclient.utils.shared_memory, perf_analyzer
`--shared-memory system`), registers a region of it by name, key, offset and byte size, and then
names that region in an input's or output's `shared_memory_region` / `_offset` / `_byte_size`
parameters. Off unless `temper serve --allow-client-shm`, as in Triton (`--allow-client-shm=true`):
a region lets whoever can reach the port make the server read and write that memory.

Every access is bounds-checked: against the registered region, and against the object's size at
that moment. A request's shapes are checked against the model before a byte of a region is read
(a request of a few hundred bytes may name a region of gigabytes), and only the bytes its shape
needs are read. The server never maps a region: it reads and writes through the object's descriptor
(pread/pwrite), so a client that shrinks its object while a request reads it makes that read come up
short, refused in one line, where touching a mapped page past the end would end the whole server with
SIGBUS (as it does Triton, which maps). Only regular files directly under /dev/shm are opened, never
created, never through a symlink.
Inputs are copied out of the region before they queue and outputs copied into it after the run, so
a region may be unregistered (or the client die) while a request that used it is in flight.
Regions are unmapped and their descriptors closed on unregister and when the server stops.

CUDA shared memory is refused: this server runs no GPU memory of its own to share.
"""

from __future__ import annotations

import os
import re
import stat
import threading
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

import numpy as np

from temper.artifacts.core.errors import RequestError

SHM_DIR = "/dev/shm"
KEY = re.compile(r"/?([A-Za-z0-9_.-]{1,255})")
ENABLE = "start temper serve with --allow-client-shm to use client shared memory"
NO_CUDA = ("CUDA shared memory is not supported: temper serve shares system memory only; "
           "use system shared memory (tritonclient.utils.shared_memory, perf_analyzer --shared-memory system)")

Kind = Literal["invalid", "not_found", "forbidden"]


class ShmError(RequestError):
    """A shared-memory request the server refuses; `kind` picks the HTTP status and gRPC code."""

    def __init__(self, message: str, kind: Kind = "invalid") -> None:
        super().__init__(message)
        self.kind = kind


class Target(NamedTuple):
    """Where a tensor lives: `byte_size` bytes at `offset` into the registered region `region`."""

    region: str
    offset: int
    byte_size: int


@dataclass
class _Region:
    name: str
    key: str
    offset: int  # into the object
    byte_size: int
    fd: int  # the object's descriptor: every copy is a pread or pwrite on it, never a mapping

    def span(self, target: Target, where: str) -> int:
        """Where `target` starts in the object, after both bounds checks."""
        if target.offset + target.byte_size > self.byte_size:
            raise ShmError(f"{where}: shared_memory_offset {target.offset} + shared_memory_byte_size "
                           f"{target.byte_size} is past the end of region '{self.name}' ({self.byte_size} bytes)")
        needed = self.offset + self.byte_size
        size = os.fstat(self.fd).st_size  # the object's size now
        if size < needed:
            raise ShmError(self._shrank(where, size, needed))
        return self.offset + target.offset

    def read_into(self, where: str, buffer: memoryview, at: int) -> None:
        """Fill `buffer` from the object at `at`; a read that comes up short (the object shrank meanwhile)
        is refused."""
        done = 0
        while done < len(buffer):
            got = os.preadv(self.fd, [buffer[done:]], at + done)
            if got == 0:
                raise ShmError(self._shrank(where, os.fstat(self.fd).st_size, self.offset + self.byte_size))
            done += got

    def write_from(self, data: memoryview, at: int) -> None:
        done = 0
        while done < len(data):  # past a shrunk object's end, the write grows it again: nothing faults
            done += os.pwrite(self.fd, data[done:], at + done)

    def _shrank(self, where: str, size: int, needed: int) -> str:
        return (f"{where}: the object behind region '{self.name}' (key '{self.key}') shrank to {size} bytes, "
                f"under the {needed} the region was registered with; register it again")

    def close(self) -> None:
        os.close(self.fd)


class ClientRegions:
    """The registered regions, shared by the REST and gRPC servers (one namespace, as in Triton).

    Thread-safe: the event loop, the decode thread and gRPC's pool threads all use it; a copy in or
    out holds the lock, so unregistering never unmaps memory under a copy."""

    def __init__(self, allowed: bool = False) -> None:
        self.allowed = allowed
        self._regions: dict[str, _Region] = {}
        self._lock = threading.Lock()

    def register(self, name: str, key: object, offset: object, byte_size: object) -> None:
        """Map `byte_size` bytes at `offset` of the object /dev/shm/KEY as region `name`."""
        self._allowed()
        if not name:
            raise ShmError("a shared memory region needs a name")
        match = KEY.fullmatch(key) if isinstance(key, str) else None
        if match is None or match[1] in (".", ".."):
            raise ShmError(f"region '{name}': key {key!r} is not a shared memory key (a name such as '/input0', "
                           "letters, digits, '_', '.' and '-')")
        for field, value in (("offset", offset), ("byte_size", byte_size)):
            if type(value) is not int or value < 0:
                raise ShmError(f"region '{name}': {field} must be a non-negative integer, got {value!r}")
        assert isinstance(offset, int) and isinstance(byte_size, int)
        if byte_size == 0:
            raise ShmError(f"region '{name}': byte_size must be more than 0")
        with self._lock:
            if name in self._regions:
                raise ShmError(f"shared memory region '{name}' is registered already; unregister it first")
            self._regions[name] = _open(name, match.string, offset, byte_size, os.path.join(SHM_DIR, match[1]))

    def unregister(self, name: str = "") -> None:
        """Release region `name` (every region when empty); a name not registered is no error, as in Triton."""
        self._allowed()
        with self._lock:
            names = [name] if name in self._regions else [] if name else list(self._regions)
            for gone in names:
                self._regions.pop(gone).close()

    def status(self, name: str = "") -> list[dict[str, Any]]:
        """Each registered region (only `name` when given) as Triton's status lists it."""
        self._allowed()
        with self._lock:
            if name and name not in self._regions:
                raise ShmError(f"no shared memory region '{name}' is registered", "not_found")
            return [{"name": r.name, "key": r.key, "offset": r.offset, "byte_size": r.byte_size}
                    for r in self._regions.values() if not name or r.name == name]

    def target(self, where: str, params: object) -> Target | None:
        """The shared-memory target an input's or output's parameters name, None when they name none;
        ShmError while shared memory is off, when only some of the parameters are given or a value has
        the wrong type."""
        if not isinstance(params, dict) or not any(key.startswith("shared_memory_") for key in params):
            return None
        self._allowed()
        region, size, offset = (params.get(k) for k in ("shared_memory_region", "shared_memory_byte_size",
                                                        "shared_memory_offset"))
        if not isinstance(region, str) or not region:
            raise ShmError(f"{where}: parameters.shared_memory_region must name a registered region, got {region!r}")
        if type(size) is not int or size < 0:
            raise ShmError(f"{where}: parameters.shared_memory_byte_size must be a non-negative integer, "
                           f"got {size!r}")
        if offset is None:
            offset = 0
        if type(offset) is not int or offset < 0:
            raise ShmError(f"{where}: parameters.shared_memory_offset must be a non-negative integer, got {offset!r}")
        return Target(region, offset, size)

    def read(self, where: str, target: Target, dtype: np.dtype, count: int) -> np.ndarray:
        """A copy of `count` elements of `dtype` from `target`, which must hold exactly that many bytes."""
        self._allowed()
        if target.byte_size != count * dtype.itemsize:
            raise ShmError(f"{where}: shared_memory_byte_size {target.byte_size} does not match its shape and "
                           f"datatype ({count * dtype.itemsize} bytes)")
        array = np.empty(count, dtype=dtype)
        with self._lock:
            region = self._region(where, target)
            region.read_into(where, array.data.cast("B"), region.span(target, where))
        return array

    def check(self, where: str, target: Target) -> None:
        """ShmError unless `target` is inside a registered region: before the run, so a request that
        cannot be answered is not computed."""
        self._allowed()
        with self._lock:
            self._region(where, target).span(target, where)

    def write(self, where: str, target: Target, array: np.ndarray) -> int:
        """Copy `array` (little-endian, C order) to the start of `target`; the bytes written."""
        self._allowed()
        data = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
        if data.nbytes > target.byte_size:
            raise ShmError(f"{where}: shared_memory_byte_size {target.byte_size} is too small for the output "
                           f"({data.nbytes} bytes, shape {list(array.shape)})")
        with self._lock:
            region = self._region(where, target)
            region.write_from(data.reshape(-1).view(np.uint8).data, region.span(target, where))
        return data.nbytes

    def close(self) -> None:
        """Release every region: the server is stopping."""
        with self._lock:
            for region in self._regions.values():
                region.close()
            self._regions.clear()

    def __len__(self) -> int:
        return len(self._regions)

    def _allowed(self) -> None:
        if not self.allowed:
            raise ShmError(f"client shared memory is off; {ENABLE}", "forbidden")

    def _region(self, where: str, target: Target) -> _Region:
        region = self._regions.get(target.region)
        if region is None:
            raise ShmError(f"{where}: no shared memory region '{target.region}' is registered; register it first")
        return region


def _open(name: str, key: str, offset: int, byte_size: int, path: str) -> _Region:
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise ShmError(f"region '{name}': cannot open shared memory key '{key}': {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ShmError(f"region '{name}': key '{key}' is not a shared memory object")
        if offset + byte_size > info.st_size:
            raise ShmError(f"region '{name}': offset {offset} + byte_size {byte_size} is past the end of the "
                           f"object behind key '{key}' ({info.st_size} bytes)")
    except BaseException:
        os.close(fd)
        raise
    return _Region(name, key, offset, byte_size, fd)
