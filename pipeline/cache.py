"""Content-addressed store of step outputs: key = hash(input model, step, options, data, library versions)."""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self

import numpy as np
import platformdirs
from filelock import FileLock

from temper.artifacts.core import distributions
from temper.pipeline.quantize_backends import BACKENDS

MODEL_FILE = "model.onnx"
TUNING_FILE = "tuning.json"  # written beside a model by the quantize fallback: its trials and ranking
META_FILE = "meta.json"

# Part of every step's key: the `build` rows of artifacts/core/distributions.py and every quantize backend's libraries
# (its registry entry names them), so a new backend, or an upgraded one, cannot serve a stale INT8 model; an
# optional backend's library is "absent" where it is not installed.
LIBRARIES = tuple(dict.fromkeys((*distributions.of_role("build"),
                                 *(library for backend in BACKENDS.values() for library in backend.libraries))))


def library_versions() -> dict[str, str]:
    """Each library's version, from whichever of its distributions provides it (onnxruntime-gpu named)."""
    return {name: distributions.key_version(name) for name in LIBRARIES}


PACKAGES = ("temper.pipeline", "temper.calibration", "temper.validators", "temper.artifacts")


@functools.cache
def source_digest(packages: tuple[str, ...] = PACKAGES) -> str:
    """sha256 over temper's own source files (each package's .py and .json files, by relative path): a
    cached result depends on the code that computed it, and an install from a git commit keeps the version
    number of the last release, so the version alone would serve a changed step's old output."""
    digest = hashlib.sha256()
    for package in packages:
        spec = importlib.util.find_spec(package)
        assert spec is not None and spec.submodule_search_locations, package
        root = Path(next(iter(spec.submodule_search_locations)))
        for file in sorted(f for f in root.rglob("*") if f.suffix in (".py", ".json") and f.is_file()):
            digest.update(f"{package}/{file.relative_to(root).as_posix()}\0".encode())
            digest.update(file.read_bytes())
    return digest.hexdigest()


def cache_versions() -> dict[str, str]:
    """What every cache key holds of the software: the libraries' versions and temper's own source."""
    return {**library_versions(), "temper-ml source": source_digest()}


def default_root() -> Path:
    """$TEMPER_CACHE_DIR, else the platform's user cache folder (honours $XDG_CACHE_HOME on Linux), made
    absolute now: `TEMPER_CACHE_DIR=relcache` in a CI workspace must not depend on a later working folder."""
    chosen = os.environ.get("TEMPER_CACHE_DIR") or platformdirs.user_cache_path("temper", appauthor=False)
    return Path(chosen).expanduser().resolve()


def key_of(**parts: Any) -> str:
    """Stable hash of JSON-able parts (sorted keys, so dict order never changes a key)."""
    blob = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


class StepCache:
    """One folder per key holding `model.onnx` (+ external data) and `meta.json`.

    Writes are atomic and serialised per key by a file lock beside the folder, so jobs sharing a
    cache never see a half-written folder nor delete one another's stored result.
    """

    def __init__(self, root: Path, enabled: bool = True) -> None:
        # Absolute from the start: steps hand these paths to libraries run in other working folders.
        self.root, self.enabled = Path(root).expanduser().resolve(), enabled

    def _folder(self, key: str) -> Path:
        return self.root / key[:2] / key

    def lock(self, key: str) -> FileLock:
        """The inter-process lock of `key`: reentrant, one instance per path in a process.

        `put` takes it; a caller that checks, builds and stores (get, build, put) can hold it around
        all three so that a second job waits for the first one's result instead of building it again.
        """
        folder = self._folder(key)
        folder.parent.mkdir(parents=True, exist_ok=True)
        return FileLock(folder.parent / f"{key}.lock", is_singleton=True)

    def get(self, key: str) -> tuple[Path, dict[str, Any]] | None:
        folder = self._folder(key)
        if not self.enabled:
            return None
        try:
            meta = json.loads((folder / META_FILE).read_text())
        except (FileNotFoundError, NotADirectoryError):  # never stored, or a --no-cache job is swapping it now
            return None
        return folder / MODEL_FILE, meta

    def put(self, key: str, produced: Path, meta: dict[str, Any]) -> Path:
        """Move the folder holding `produced` (a model.onnx) into the store; return the stored model path.

        If another job stored the key while this one built it, its result is kept (same key, same
        content) and `produced` is discarded: replacing it could pull files from under that job.
        A disabled cache (--no-cache) always replaces, by swapping whole folders, never in place.
        """
        folder = self._folder(key)
        (produced.parent / META_FILE).write_text(json.dumps(meta, indent=2))
        with self.lock(key):
            if self.enabled and (folder / META_FILE).is_file():
                shutil.rmtree(produced.parent, ignore_errors=True)
                return folder / MODEL_FILE
            staging = _unused_name(folder.parent, ".incoming-")
            shutil.move(str(produced.parent), staging)
            outgoing = None
            if folder.exists():  # an interrupted run's leftover, or a refresh: set it aside in one rename
                outgoing = _unused_name(folder.parent, ".outgoing-")
                os.replace(folder, outgoing)
            os.replace(staging, folder)
            if outgoing is not None:
                shutil.rmtree(outgoing, ignore_errors=True)
        return folder / MODEL_FILE


class _KeyedFiles:
    """One file per key (a hash of the parts and the library versions) under `root`, beside the step
    folders: written aside and renamed over under the key's file lock, so a reader sees a whole file or
    none; with `enabled` False (--no-cache) nothing is read and every result replaces the stored one."""

    FOLDER = ""  # under the step cache's root
    SUFFIX = ""

    def __init__(self, root: Path, enabled: bool = True) -> None:
        self.root, self.enabled = Path(root).expanduser().resolve(), enabled

    def _file(self, parts: dict[str, Any]) -> Path:
        key = key_of(parts=parts, libraries=cache_versions())
        return self.root / key[:2] / f"{key}{self.SUFFIX}"

    def _replace(self, parts: dict[str, Any], write: Callable[[Path], object]) -> None:
        path = self._file(parts)
        path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(path.parent / f"{path.name}.lock", is_singleton=True):
            staging = _unused_name(path.parent, ".incoming-")
            write(staging)
            os.replace(staging, path)

    @classmethod
    def beside(cls, steps: StepCache) -> Self:
        """The store of a step cache: the same root and the same --no-cache."""
        return cls(steps.root / cls.FOLDER, steps.enabled)


class RecordStore(_KeyedFiles):
    """JSON records keyed like steps, for results that are measurements rather than models: the session
    settings search (validators/session_search.py) keeps one per model, host and settings table, so a
    second run on the same host reuses it (`records/`)."""

    FOLDER, SUFFIX = "records", ".json"

    def get(self, parts: dict[str, Any]) -> dict[str, Any] | None:
        if not self.enabled:
            return None
        try:
            return json.loads(self._file(parts).read_text())
        except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError):  # none, or not a whole record
            return None

    def put(self, parts: dict[str, Any], record: dict[str, Any]) -> None:
        self._replace(parts, lambda staging: staging.write_text(json.dumps(record, indent=2)))


class OutputStore(_KeyedFiles):
    """Model outputs over a data set (validators.evaluate.predict), keyed by everything they depend on
    (model content, data, engine, host, library versions): the baseline's outputs over the evaluation
    and calibration sets are read by `temper check`, the quantize fallback's scorer and the gates, so a
    run computed them up to four times, and a `temper check` before it twice more (`outputs/`).
    Outputs over MAX_BYTES are not kept: reading them back would cost about what computing them does."""

    FOLDER, SUFFIX = "outputs", ".npz"
    MAX_BYTES = 2**28

    def get(self, parts: dict[str, Any]) -> dict[str, np.ndarray] | None:
        if not self.enabled:
            return None
        try:
            with np.load(self._file(parts), allow_pickle=False) as stored:
                names = [str(n) for n in stored[_NAMES]]
                return {name: stored[f"o{index}"] for index, name in enumerate(names)}
        except (FileNotFoundError, NotADirectoryError, KeyError, ValueError, OSError, zipfile.BadZipFile):
            return None  # none, or not a whole file: computed again

    def put(self, parts: dict[str, Any], outputs: dict[str, np.ndarray]) -> None:
        if sum(np.asarray(v).nbytes for v in outputs.values()) > self.MAX_BYTES:
            return
        entries: dict[str, Any] = {f"o{index}": np.asarray(v) for index, v in enumerate(outputs.values())}
        entries[_NAMES] = np.array(list(outputs))

        def write(staging: Path) -> None:
            with open(staging, "wb") as fh:  # a file object: np.savez would add .npz to a name
                np.savez(fh, **entries)

        self._replace(parts, write)


_NAMES = "names"  # the entry holding the output names (entries are o0, o1, ... : names may hold '/')


class RangeStore(_KeyedFiles):
    """Calibrated activation ranges (ONNX Runtime's calibration cache file, JSON), keyed by the model the
    calibrator read, the calibration options and data, and the host: a plain static INT8 candidate and
    its fallback twin, and the fallback's per-channel configuration, calibrate the same model with the same
    data, which is the slowest part of a static quantize after the trials (MiniLM: about 18 s each on a
    2-core AVX2 EPYC). Weight settings (per_channel, weight_type) do not enter a calibration (`ranges/`)."""

    FOLDER, SUFFIX = "ranges", ".json"

    def get(self, parts: dict[str, Any]) -> str | None:
        if not self.enabled:
            return None
        try:
            text = self._file(parts).read_text()
            json.loads(text)  # a whole file, or none
            return text
        except (FileNotFoundError, NotADirectoryError, UnicodeDecodeError, json.JSONDecodeError):
            return None

    def put(self, parts: dict[str, Any], ranges: Path) -> None:
        self._replace(parts, lambda staging: shutil.copyfile(ranges, staging))


def _unused_name(parent: Path, prefix: str) -> Path:
    """A fresh path in `parent` that nothing occupies, for a folder to be renamed or moved to."""
    path = Path(tempfile.mkdtemp(dir=parent, prefix=prefix))
    path.rmdir()
    return path
