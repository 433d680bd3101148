"""The models a server serves now: name -> its loaded Runtime and version, with Triton's model control.

Both servers hold one `Models` (a single bundle is a Models of one), so there is one code path for one model
and for a repository of many. Loading builds a Runtime and starts it (warm-up included) on the caller's
thread: the REST server calls it on a worker thread, the gRPC server on its RPC thread, both blocking until
the model is ready, as Triton's load API does. Unloading stops the Runtime: requests still queued fail with
Stopped (503 / UNAVAILABLE) and later ones find no model (404 / NOT_FOUND). Loading a model already loaded
serves the repository's newest version: the new one is started before the old one stops, so requests
keep being answered.

Model control modes are Triton's: `none` loads every model at start and refuses load and unload (Triton's
code, UNAVAILABLE); `explicit` loads the startup models and the rest on request. Readiness follows
Triton's strict readiness: ready when every model asked for (at start or since, and not unloaded) is loaded
and ready; a failed load keeps the server not ready until that model loads or is unloaded. Not strict:
ready once start-up is done.

Ensembles (artifacts/serving/ensemble_runtime.py): loading one loads its composing models first (each as any load: one
already loaded stays), as Triton's does; unloading it unloads those it loaded that nobody asked for by name and no
other loaded ensemble runs (Triton's rule too). Unloading a composing model on its own leaves the ensemble loaded
and not ready until the ensemble is loaded again.

Memory per model (`Loaded.memory`): with worker instances, the summed RSS of the model's worker processes
now; in the server's process a model's sessions cannot be told apart from the rest, so what is reported
is the growth of this process's RSS across the model's load (Triton's `memory_usage` is also what its load
saw). Loads running at the same time, or memory freed by an earlier unload and reused, blur that figure.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import psutil

from temper.artifacts.core.errors import first_line
from temper.artifacts.engines import gpu_memory
from temper.artifacts.engines.providers import PROVIDERS
from temper.artifacts.formats.bundle import ServingConfig, TensorSpec
from temper.artifacts.formats.integrity import check_bundle
from temper.artifacts.formats.repository import DEFAULT_VERSION, Catalog, LoadFailed, ModelNotServed, OneBundle, Source
from temper.artifacts.serving.ensemble_runtime import Ensemble
from temper.artifacts.serving.runtime import Runtime

log = logging.getLogger("temper.serving")

Serving = Runtime | Ensemble  # what a loaded model is served by
MODES = ("none", "explicit")
EVERY = "*"  # --load-model '*': every model of the repository, as Triton spells it
WORKERS_RSS, LOAD_GROWTH = "workers_rss", "load_rss_growth"


class ControlDisabled(RuntimeError):
    """Load or unload in model control mode none: Triton answers UNAVAILABLE (HTTP 503)."""


@dataclass
class Loaded:
    """A model being served: its Runtime, the version it serves, and what the servers count beside it."""

    name: str
    version: str
    runtime: Serving
    load_growth: int = 0  # this process's RSS growth across the load, bytes
    refused: int = 0  # inference requests the REST server turned away before the Runtime (event loop only)
    inputs: dict[str, TensorSpec] = field(init=False)
    outputs: list[str] = field(init=False)

    def __post_init__(self) -> None:
        self.inputs = {spec.name: spec for spec in self.runtime.config.inputs}
        self.outputs = [spec.name for spec in self.runtime.config.outputs]

    def memory(self) -> tuple[int, str]:
        """(bytes, how measured): the worker processes' RSS now, or the RSS growth across the load in-process."""
        pool = self.runtime.pool
        if pool is None:
            return self.load_growth, LOAD_GROWTH
        total = 0
        for instance in pool.instances:
            with contextlib.suppress(psutil.Error):  # restarting: not counted until it runs again
                total += psutil.Process(instance.pid).memory_info().rss if instance.pid else 0
        return total, WORKERS_RSS

    def gpu_memory(self) -> int | None:
        """Bytes the model's processes hold on the GPU (its workers', or this process's in-process), as the
        driver reports them (artifacts/engines/gpu_memory.py); None for a model on a CPU engine (an ensemble: its
        composing models report theirs), or no reading."""
        if isinstance(self.runtime, Ensemble) or not PROVIDERS[self.runtime.provider].gpu:
            return None
        pool = self.runtime.pool
        pids = [os.getpid()] if pool is None else [i.pid for i in pool.instances if i.pid]
        used = gpu_memory.used_mb(pids)
        return None if used is None else int(used * 2**20)


def runtime_of(source: Source, instances: int | None) -> Runtime:
    """A version folder's Runtime, as the repository serves it (no backup model: pipeline/cli/backups.py adds one)."""
    return Runtime(source.folder, config=source.serving_config(), instances=instances)


class Models:
    """Thread safe: the REST event loop, the gRPC threads and loads on worker threads read and change it."""

    def __init__(self, catalog: Catalog, mode: str = "none", startup: list[str] | None = None, strict: bool = True,
                 instances: int | None = 0, build: Callable[[Source, int | None], Runtime] = runtime_of,
                 notify: Callable[[str], None] | None = None) -> None:
        """`startup`: what explicit mode loads at start (names, or ['*']); none mode loads everything.
        `notify` hears each model's warnings (an unchecked bundle, another host, other libraries) as it loads."""
        if mode not in MODES:
            raise ValueError(f"model control mode must be one of {', '.join(MODES)}, got {mode!r}")
        self.catalog, self.mode, self.strict, self.instances = catalog, mode, strict, instances
        self.startup = list(startup or [])
        self.build, self.notify = build, notify
        self.started = False
        self._lock = threading.Lock()
        self._loaded: dict[str, Loaded] = {}
        self._states: dict[str, tuple[str, str, str]] = {}  # not (yet) loaded: name -> (version, state, reason)
        self._wanted: set[str] = set()  # asked for and not unloaded: what strict readiness waits on
        self._guards: dict[str, threading.Lock] = {}  # one load or unload of a model at a time
        self._asked: set[str] = set()  # loaded by name (at start or through the load API), not as a step
        self._steps: dict[str, list[str]] = {}  # each loaded ensemble's composing models

    @classmethod
    def single(cls, runtime: Runtime, version: str = DEFAULT_VERSION, growth: int = 0, mode: str = "none",
               strict: bool = True, notify: Callable[[str], None] | None = None) -> Models:
        """A server of one bundle whose Runtime is built already (started by start(), or before); `growth`: the
        RSS its construction took. In explicit mode it is loaded at start all the same: it is what was asked for."""
        source = Source(runtime.config.name, version, runtime.bundle, runtime.config)
        models = cls(OneBundle(source), mode, [source.name], strict, runtime.instances, notify=notify)
        models._loaded[source.name] = Loaded(source.name, version, runtime, growth)
        models._wanted.add(source.name)
        return models

    # -- reading ----------------------------------------------------------------------------

    def get(self, name: str, version: str = "") -> Loaded:
        """The loaded model; ModelNotServed for an unknown or unloaded model, or a version it does not serve."""
        loaded = self._loaded.get(name)
        if loaded is None:
            known = name in self._states or name in self.catalog.names()
            raise ModelNotServed(f"model '{name}' is not loaded" if known else f"unknown model '{name}'")
        if version and version != loaded.version:
            raise ModelNotServed(f"model '{name}' has no version '{version}'; it serves version {loaded.version}")
        return loaded

    def serving(self, name: str) -> Serving:
        """What serves a loaded model (an ensemble's steps look their models up here per request); ModelNotServed."""
        return self.get(name).runtime

    def all(self) -> list[Loaded]:
        with self._lock:
            return sorted(self._loaded.values(), key=lambda m: m.name)

    def only(self) -> Loaded | None:
        """The one model loaded, when there is exactly one (what a request naming no model is counted against)."""
        loaded = self.all()
        return loaded[0] if len(loaded) == 1 else None

    @property
    def live(self) -> bool:
        """What /v2/health/live and ServerLive answer: false once every model loaded is taken out (its workers
        kept crashing), since then the server serves nothing and cannot recover alone, so an orchestrator's
        liveness probe restarts it; one model of several taken out leaves the server live (the others serve)
        and that model not ready, until a load revives it."""
        loaded = self.all()
        return not loaded or not all(m.runtime.taken_out for m in loaded)

    @property
    def ready(self) -> bool:
        """What /v2/health/ready and ServerReady answer (module docstring: strict readiness)."""
        if not self.strict:
            return self.started
        with self._lock:
            return all(n in self._loaded and self._loaded[n].runtime.ready for n in self._wanted)

    def index(self, ready_only: bool = False) -> list[dict[str, str]]:
        """Triton's repository index: every model of the catalog; a model never asked for by name only, the others
        with version, state (READY, UNAVAILABLE, LOADING) and a reason when there is one."""
        with self._lock:
            loaded, states = dict(self._loaded), dict(self._states)
        entries = []
        for name in sorted({*self.catalog.names(), *loaded, *states}):
            rows = []
            if name in loaded and (name not in states or states[name][0] != loaded[name].version):
                model = loaded[name]
                ready = model.runtime.ready
                why = model.runtime.taken_out or "starting, or every instance restarting"
                rows.append({"name": name, "version": model.version, "state": "READY" if ready else "UNAVAILABLE",
                             **({} if ready else {"reason": why})})
            if name in states:  # loading, failed or unloaded: for the version in the repository now
                version, state, reason = states[name]
                row = {"name": name, **({"version": version} if version else {}), "state": state}
                rows.append({**row, **({"reason": reason} if reason else {})})
            if not rows and not ready_only:
                rows.append({"name": name})
            entries += [row for row in rows if not ready_only or row.get("state") == "READY"]
        return entries

    def configs(self) -> list[ServingConfig]:
        """The ServingConfig of every model the server may serve (for limits sized to the largest)."""
        found = []
        for name in self.catalog.names():
            loaded = self._loaded.get(name)
            try:
                found.append(loaded.runtime.config if loaded else self.catalog.locate(name).serving_config())
            except (LoadFailed, OSError, ValueError):  # a broken version folder: its load says why
                continue
        return found

    def capacity(self) -> int:
        """Requests every model together can hold queued and running (the gRPC server admits that many RPCs)."""
        total = 0
        for config in self.configs():
            loaded = self._loaded.get(config.name)
            total += config.max_queue + (loaded.runtime.max_rows if loaded else config.max_batch_size)
        return max(total, 1)

    # -- control ----------------------------------------------------------------------------

    def start(self) -> None:
        """Load the startup models (none mode: all), each warmed up; the first failure is raised (the server
        does not start, as Triton exits on a model that fails to load)."""
        if self.mode == "none" or EVERY in self.startup:
            names = self.catalog.names()
        else:
            names = self.startup
        for name in names:
            self._asked.add(name)
            self._load(name)
        self.started = True

    def stop(self) -> None:
        self.started = False
        for model in self.all():
            model.runtime.stop()

    def load(self, name: str) -> Loaded:
        """The load API: explicit mode only (ControlDisabled otherwise); LoadFailed says why a model did not load."""
        self._control("load")
        if name in self.catalog.names():
            self._asked.add(name)
        return self._load(name)

    def unload(self, name: str) -> None:
        """The unload API: stop the model's Runtime and stop serving it. A model not loaded is left as it is."""
        self._control("unload")
        if name not in self._loaded and name not in self.catalog.names():
            raise LoadFailed(f"cannot unload '{name}': no such model")
        self._asked.discard(name)
        self._unload(name)

    def _unload(self, name: str) -> None:
        """Stop serving `name`; then the composing models an ensemble loaded that nothing else needs (docstring)."""
        with self._guard(name):
            with self._lock:
                model = self._loaded.pop(name, None)
                self._wanted.discard(name)
                if model is not None or name in self._states:
                    version = model.version if model else self._states[name][0]
                    self._states[name] = (version, "UNAVAILABLE", "unloaded")
            if model is not None:
                model.runtime.stop()
                log.info("%s: version %s unloaded", name, model.version)
        with self._lock:
            steps = self._steps.pop(name, [])
            needed = {m for others in self._steps.values() for m in others} | self._asked
        for step in steps:
            if step not in needed and step in self._loaded:
                self._unload(step)

    def _control(self, action: str) -> None:
        if self.mode != "explicit":
            raise ControlDisabled(f"explicit model {action} is not allowed in model control mode none: start "
                                  "`temper serve` with --model-control-mode explicit")

    def _guard(self, name: str) -> threading.Lock:
        with self._lock:
            return self._guards.setdefault(name, threading.Lock())

    def _load(self, name: str, within: tuple[str, ...] = ()) -> Loaded:
        if name not in self.catalog.names():  # not a model here: refused before anything is kept for its name
            with self._lock:
                kept = name in self._loaded or name in self._states
            if not kept:
                self.catalog.locate(name)  # LoadFailed; a folder copied in since names() read is loaded below
        with self._guard(name):
            try:
                source = self.catalog.locate(name)
            except LoadFailed as exc:
                if name in self.catalog.names():  # there, but its newest version cannot serve: not ready until fixed
                    with self._lock:
                        self._wanted.add(name)
                        self._states[name] = ("", "UNAVAILABLE", str(exc))
                raise
            if source.ensemble is not None:  # its composing models first: each serves once it is loaded
                with self._lock:
                    self._wanted.add(name)
                    self._steps[name] = source.ensemble.models
                for step in source.ensemble.models:
                    try:
                        if step in (*within, name):
                            raise LoadFailed(f"ensemble '{name}' runs '{step}', which runs '{name}' (a cycle)")
                        self._load(step, (*within, name))
                    except LoadFailed as exc:
                        with self._lock:
                            self._states[name] = (source.version, "UNAVAILABLE", str(exc))
                        raise LoadFailed(f"failed to load ensemble '{name}': {exc}") from exc
            with self._lock:
                self._wanted.add(name)
                current = self._loaded.get(name)
                same = current is not None and current.version == source.version
                if current is not None and same and current.runtime.ready:
                    return current  # loaded already: nothing newer to serve
                revive = current is not None and current.runtime.taken_out is not None  # a load starts it anew
                prebuilt = current.runtime if current is not None and same and not revive else None  # built only
                self._states[name] = (source.version, "LOADING", "")
            process = psutil.Process()
            before = process.memory_info().rss
            try:
                runtime = prebuilt or self._build(source)
                runtime.start()
            except Exception as exc:
                with self._lock:
                    self._states[name] = (source.version, "UNAVAILABLE", first_line(exc))
                raise LoadFailed(f"failed to load '{name}' version {source.version}: {first_line(exc)}") from exc
            growth = max(0, process.memory_info().rss - before) + (current.load_growth if prebuilt and current else 0)
            model = Loaded(name, source.version, runtime, growth)
            with self._lock:
                self._loaded[name] = model
                self._states.pop(name, None)
            if current is not None and current.runtime is not runtime:
                current.runtime.stop()  # after the new one serves: no request finds neither
            log.info("%s: version %s loaded", name, source.version)
            return model

    def _build(self, source: Source) -> Serving:
        """A Runtime for a version folder, its model checked against its manifest first (Mismatch: not loaded); an
        Ensemble over the composing models loaded here for an ensemble."""
        if source.ensemble is not None:
            return Ensemble(source.ensemble, source.folder, self.serving)
        if source.config is None:
            unchecked = check_bundle(source.folder, "export it again with `temper export-triton`")
            if unchecked:
                self._tell(unchecked)
        runtime = self.build(source, self.instances)
        for warning in (runtime.host_warning, runtime.drift_warning):
            if warning:
                self._tell(f"{source.name}: {warning}")
        return runtime

    def _tell(self, warning: str) -> None:
        log.warning("%s", warning)
        if self.notify is not None:
            self.notify(warning)
