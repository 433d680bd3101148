"""The gateway's pool of inference worker processes (Triton's model instances), kept alive.

Each instance is one artifacts/serving/worker.py process with its own session and its own pair of shared
memory regions (artifacts/serving/tensor_memory.py). The batcher's threads call run(): it takes an idle
ready instance, writes the batch's inputs into that instance's input region, sends the descriptor
over the instance's control socket and waits for the answer's descriptor; the outputs are copied
out of the output region.

A supervisor thread per instance starts its worker, warms it up (every batch size, as the in-process
runtime does) and only then marks it ready; it waits for the process to end and starts it again.
A worker that dies (SIGSEGV in native code, SIGKILL, the OOM killer) fails the one batch it was
running, with InstanceLost (HTTP 503, gRPC UNAVAILABLE), and nothing else: requests still queued
go to the other instances, or to this one once it is back. The lost batch is not retried on
another instance, because a request that crashed one worker may well crash the next one (a shape
that trips a native bug), taking a second batch of innocent requests with it; the client decides.
A batch that never reached a worker (it died before taking it) is sent to another instance.
An instance whose worker dies CRASH_LOOP_DEATHS times within CRASH_LOOP_S is taken out with one log
line, not restarted any more; with no instance left the model is not ready.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from temper.artifacts.core.errors import InstanceLost, Stopped
from temper.artifacts.engines import EngineSettings
from temper.artifacts.engines.providers import Provider
from temper.artifacts.formats.bundle import ServingConfig
from temper.artifacts.serving.tensor_memory import Region, regions_for
from temper.artifacts.serving.worker import Channel

log = logging.getLogger("temper.serving.workers")  # serve shows its warnings: deaths, instances taken out

Arrays = dict[str, np.ndarray]
CRASH_LOOP_DEATHS = 3  # deaths of one instance within CRASH_LOOP_S that take it out
CRASH_LOOP_S = 60.0
START_TIMEOUT_S = 300.0  # a worker that has not loaded its session by then is killed (a TensorRT build is slow)


@dataclass
class Instance:
    """One worker process and what the gateway holds of it."""

    index: int
    inputs: Region
    outputs: Region
    process: subprocess.Popen | None = None
    control: Channel | None = None
    ready: bool = False  # started, warmed up and not known dead
    removed: bool = False  # taken out after dying too often
    restarts: int = 0
    generation: int = 0  # which worker of this instance, counted from 0: a late release of a dead one is ignored
    deaths: deque[float] = field(default_factory=deque)  # monotonic times of recent deaths

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None


class WorkerPool:
    """`count` worker processes serving `model` on `provider` with `settings` (ONNX Runtime's on `providers`,
    or an OpenVINO engine's)."""

    def __init__(self, model: Path, config: ServingConfig, provider: Provider, settings: EngineSettings,
                 providers: list[str], count: int, max_rows: int, warm_inputs: Callable[[], list[Arrays]]) -> None:
        self.model, self.config, self.provider = model, config, provider
        self.settings, self.providers = settings, providers
        self.warm_inputs = warm_inputs
        self.instances = [Instance(i, *regions_for(config, max_rows, f"{config.name}-{i}")) for i in range(count)]
        self._idle: deque[Instance] = deque()
        self._cond = threading.Condition()
        self._running = False
        self._supervisors: list[threading.Thread] = []
        self._started = threading.Barrier(count + 1)
        self._failure: str | None = None  # why a first start failed
        self.last_death: str | None = None  # how the last worker to die ended ("signal 11", "exit code 1")

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        """Start every instance and return once each is ready; RuntimeError if one cannot start at all."""
        self._running = True
        for instance in self.instances:
            thread = threading.Thread(target=self._supervise, args=(instance,), daemon=True,
                                      name=f"temper-instance-{self.config.name}-{instance.index}")
            self._supervisors.append(thread)
            thread.start()
        self._started.wait()
        if self._failure:
            self.stop()
            raise RuntimeError(self._failure)

    def stop(self) -> None:
        """End every worker (its socket closed, then SIGKILL if it has not exited within 10 s) and free the
        regions."""
        with self._cond:
            self._running = False
            self._idle.clear()
            self._cond.notify_all()
        for instance in self.instances:
            if instance.control is not None:
                with contextlib.suppress(OSError):
                    instance.control.shutdown()  # the worker's receive ends: it exits
        for thread in self._supervisors:
            thread.join(10)
        for instance in self.instances:
            if instance.process is not None and instance.process.poll() is None:
                instance.process.kill()
                instance.process.wait()
            instance.inputs.close()
            instance.outputs.close()

    @property
    def ready_count(self) -> int:
        return sum(i.ready for i in self.instances)

    @property
    def idle_count(self) -> int:
        """Instances ready and not running a batch now."""
        return len(self._idle)

    @property
    def alive_count(self) -> int:
        """Instances not taken out: ready, or being restarted."""
        return sum(not i.removed for i in self.instances)

    @property
    def taken_out(self) -> bool:
        """Every instance taken out after dying too often: nothing restarts them but a new load."""
        return all(i.removed for i in self.instances)

    @property
    def restarts(self) -> int:
        return sum(i.restarts for i in self.instances)

    # -- supervision ------------------------------------------------------------------------

    def _supervise(self, instance: Instance) -> None:
        first, code = True, None
        while self._running:
            try:
                self._spawn(instance)
                for inputs in self.warm_inputs():
                    self._exchange(instance, inputs)
            except Exception as exc:  # noqa: BLE001 - a worker that cannot start, or died warming up
                message = f"{self.config.name}: instance {instance.index} could not start: {exc}"
                if first:
                    self._failure = self._failure or message
                    self._kill(instance)
                    self._started.wait()
                    return
                log.error("%s", message)
            else:
                with self._cond:
                    instance.ready = True
                    self._idle.append(instance)
                    self._cond.notify_all()
                if first:
                    first = False
                    self._started.wait()
            if instance.process is not None:
                code = instance.process.wait()
            if not self._running:
                return
            self._died(instance, code)
            if instance.removed:
                return
            instance.restarts += 1

    def _died(self, instance: Instance, code: int | None) -> None:
        """Record a worker's death; take the instance out when it keeps dying."""
        with self._cond:
            instance.ready = False
            with contextlib.suppress(ValueError):
                self._idle.remove(instance)
            now = time.monotonic()
            instance.deaths.append(now)
            while instance.deaths and now - instance.deaths[0] > CRASH_LOOP_S:
                instance.deaths.popleft()
            if len(instance.deaths) >= CRASH_LOOP_DEATHS:
                instance.removed = True
            left = sum(not i.removed for i in self.instances)
            self._cond.notify_all()
        how = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
        self.last_death = how
        if instance.removed:
            log.error("%s: instance %d taken out: its worker died %d times within %.0fs (last: %s); %d instance(s) "
                      "left", self.config.name, instance.index, len(instance.deaths), CRASH_LOOP_S, how, left)
        else:
            log.warning("%s: instance %d worker (pid %s) died (%s); restarting it", self.config.name,
                        instance.index, instance.pid, how)
        self._close_control(instance)

    def _spawn(self, instance: Instance) -> None:
        """Start instance's worker and wait for its session to load."""
        self._close_control(instance)
        instance.generation += 1
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        spec = {"control_fd": theirs.fileno(), "input_fd": instance.inputs.fd, "input_size": instance.inputs.size,
                "output_fd": instance.outputs.fd, "output_size": instance.outputs.size,
                "model": str(self.model), "provider": self.provider, "providers": self.providers,
                "name": self.config.name, "settings": self.settings.model_dump()}
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}  # temper as this process finds it
        instance.process = subprocess.Popen(
            [sys.executable, "-m", "temper.artifacts.serving.worker", json.dumps(spec)], env=env,
            pass_fds=(theirs.fileno(), instance.inputs.fd, instance.outputs.fd), stdin=subprocess.DEVNULL)
        theirs.close()  # the worker holds it now: its death closes the socket
        instance.control = channel = Channel(ours)
        channel.settimeout(START_TIMEOUT_S)
        hello = channel.receive()
        channel.settimeout(None)
        if hello is None:
            raise RuntimeError(f"the worker exited with code {instance.process.wait()} before loading the model")
        if "error" in hello:
            raise RuntimeError(hello["error"])

    def _kill(self, instance: Instance) -> None:
        if instance.process is not None and instance.process.poll() is None:
            instance.process.kill()
            instance.process.wait()
        self._close_control(instance)

    @staticmethod
    def _close_control(instance: Instance) -> None:
        if instance.control is not None:
            instance.control.close()
            instance.control = None

    # -- requests ---------------------------------------------------------------------------

    def run(self, inputs: Arrays) -> Arrays:
        """Run one batch on an idle instance, waiting for one; InstanceLost if its worker died running
        it, Stopped if the pool stopped or no instance is left."""
        while True:
            instance = self._acquire()
            generation = instance.generation
            try:
                return self._exchange(instance, inputs)
            except _NotSent:
                continue  # it died before taking the batch: another instance (or this one restarted) runs it
            finally:
                self._release(instance, generation)

    def _acquire(self) -> Instance:
        with self._cond:
            while not self._idle:
                if not self._running:
                    raise Stopped("runtime stopped")
                if all(i.removed for i in self.instances):
                    raise Stopped(f"model '{self.config.name}' has no instance left: every worker kept dying")
                self._cond.wait()
            return self._idle.popleft()

    def _release(self, instance: Instance, generation: int) -> None:
        with self._cond:
            if instance.ready and self._running and instance.generation == generation:
                self._idle.append(instance)
                self._cond.notify()

    def _exchange(self, instance: Instance, inputs: Arrays) -> Arrays:
        """Inputs into the instance's region, its descriptor over, the outputs back (copied out)."""
        control = instance.control
        if control is None:
            raise _NotSent
        descriptor = instance.inputs.write(inputs)
        try:
            control.send({"inputs": descriptor, "size": instance.inputs.size})
        except OSError:
            instance.ready = False
            raise _NotSent from None
        try:
            answer = control.receive()
        except OSError:
            answer = None
        if answer is None:
            instance.ready = False
            raise InstanceLost(f"instance {instance.index} of '{self.config.name}' (pid {instance.pid}) died running "
                               "this request's batch; not retried; it is being restarted")
        if "error" in answer:
            raise RuntimeError(answer["error"])
        return instance.outputs.read([tuple(t) for t in answer["outputs"]], answer["size"], copy=True)


class _NotSent(Exception):
    """The batch never reached the worker: it may run elsewhere."""
