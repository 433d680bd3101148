"""OpenVINO as an engine: a model on its CPU plugin, behind the run interface an ONNX Runtime session offers.

OpenVINO reads temper's ONNX files as they are (QDQ INT8 included), so a candidate needs no other
build to run on it. The gates, `temper serve` and the pyfunc model hold an OpenVinoSession where
they would hold an onnxruntime.InferenceSession: `run(names, feed)` returns the outputs as a list,
`get_inputs()`/`get_outputs()` name the tensors.

Precision is explicit and read back. On a host with AVX512-BF16 or AMX, OpenVINO's CPU plugin runs
an FP32 graph in BF16 unless told otherwise; asked for BF16 on a host without it, it runs FP32 and
says so only when asked. So every compile names INFERENCE_PRECISION_HINT, and what the compiled
model reports is what a figure records (OpenVinoSettings.inference_precision), never the request.
Threads, streams and the performance hint are set, and recorded, the same way.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

import numpy as np
import onnx
from pydantic import ConfigDict, Field, PositiveInt

from temper.artifacts.core.errors import EnvironmentProblem
from temper.artifacts.core.host import HostProfile, profile, usable_cores
from temper.artifacts.engines.base import EngineSettings, Session
from temper.artifacts.engines.providers import PROVIDERS, Provider

log = logging.getLogger("temper.serving")

INSTALL = "pip install 'temper-ml[openvino]'"
DEVICE = "CPU"
Precision = Literal["f32", "bf16"]
_TYPE_NAMES = {"float32": "f32", "f32": "f32", "bfloat16": "bf16", "bf16": "bf16", "float16": "f16", "f16": "f16"}


class OpenVinoSettings(EngineSettings):
    """How an OpenVINO compiled model is built: what a speed figure was measured with and what serves.
    Read back from the compiled model itself (settings_of)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    inference_precision: str = Field(description="INFERENCE_PRECISION_HINT as the compiled model reports it "
                                                 "(f32, bf16): the precision the engine computes float ops in")
    num_threads: PositiveInt = Field(description="INFERENCE_NUM_THREADS")
    num_streams: PositiveInt = Field(1, description="NUM_STREAMS: one stream, as one inference thread feeds it")
    performance_hint: Literal["LATENCY", "THROUGHPUT"] = Field("LATENCY", description="PERFORMANCE_HINT")

    @property
    def threads(self) -> int:
        return self.num_threads

    @property
    def precision(self) -> str | None:
        return self.inference_precision

    def with_threads(self, count: int) -> OpenVinoSettings:
        return self.model_copy(update={"num_threads": count})

    def config(self) -> dict[str, Any]:
        """These settings as compile_model's config."""
        return {"INFERENCE_PRECISION_HINT": self.inference_precision, "INFERENCE_NUM_THREADS": self.num_threads,
                "NUM_STREAMS": self.num_streams, "PERFORMANCE_HINT": self.performance_hint}


def require() -> ModuleType:
    """The openvino package; EnvironmentProblem (exit 3) in one line when it is not installed."""
    try:
        import openvino
    except ImportError as err:
        raise EnvironmentProblem(f"the openvino engine needs OpenVINO: {INSTALL} ({err})") from err
    return openvino


def devices() -> list[str]:
    """The devices OpenVINO really offers here (empty when openvino is absent)."""
    try:
        with _this_threads_signal_stack():  # loading the plugin installs one
            return list(require().Core().available_devices)
    except EnvironmentProblem:
        return []


def version() -> str | None:
    try:
        import openvino
    except ImportError:
        return None
    return str(openvino.__version__).split("-")[0]


class _Tensor:
    """What get_inputs()/get_outputs() give: a tensor's name, as an ONNX Runtime NodeArg does."""

    def __init__(self, name: str) -> None:
        self.name = name


class OpenVinoSession:
    """One compiled model and one infer request; run() may be called from any thread (one at a time)."""

    def __init__(self, model: Path, settings: OpenVinoSettings) -> None:
        ov = require()
        core = ov.Core()
        with _this_threads_signal_stack():  # loading the plugin and compiling install one
            available = core.available_devices
            if DEVICE not in available:
                raise EnvironmentProblem(f"OpenVINO offers no {DEVICE} device here (devices: "
                                         f"{', '.join(available) or 'none'})")
            self._compiled = core.compile_model(core.read_model(str(model)), DEVICE, settings.config())
        self._request = self._compiled.create_infer_request()
        self._lock = threading.Lock()
        graph = onnx.load(str(model), load_external_data=False).graph
        initializers = {i.name for i in graph.initializer}
        self._inputs = _names(self._compiled.inputs, [v.name for v in graph.input if v.name not in initializers])
        self._outputs = _names(self._compiled.outputs, [v.name for v in graph.output])
        self._ports = dict(zip(self._outputs, self._compiled.outputs))
        self.settings = settings_of(self._compiled)

    def get_inputs(self) -> list[_Tensor]:
        return [_Tensor(name) for name in self._inputs]

    def get_outputs(self) -> list[_Tensor]:
        return [_Tensor(name) for name in self._outputs]

    def get_providers(self) -> list[str]:
        """The devices the compiled model executes on, as OpenVINO reports them (["CPU"])."""
        return [f"OpenVINO:{d}" for d in self._compiled.get_property("EXECUTION_DEVICES")]

    def run(self, names: list[str] | None, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        """The outputs `names` (all when None), copied out of the request's buffers, which the next run reuses.

        start_async + wait, never the blocking infer(): on this 2-core AMD EPYC under load, infer() took
        6.6-8.2 ms a batch-32 digits call that start_async + wait ran in 1.4-2.0 ms (ONNX Runtime 2.8-3.6 ms)."""
        with self._lock:
            self._request.start_async(feed)
            self._request.wait()
            return [np.array(self._request.get_tensor(self._ports[name]).data) for name in (names or self._outputs)]

    def bound_call(self, feed: dict[str, np.ndarray]) -> Callable[[], None]:
        """One inference with `feed` set on the request once, outputs left in its buffers: what the speed
        loop times, as ONNX Runtime's IO binding does for its sessions."""
        ov = require()
        for name, array in feed.items():
            self._request.set_tensor(name, ov.Tensor(np.require(array, requirements="C")))
        request = self._request

        def call() -> None:
            request.start_async()
            request.wait()

        return call


class _SignalStack(ctypes.Structure):
    _fields_ = [("sp", ctypes.c_void_p), ("flags", ctypes.c_int), ("size", ctypes.c_size_t)]  # stack_t


@contextmanager
def _this_threads_signal_stack() -> Iterator[None]:
    """Leave the calling thread's alternate signal stack as it was across OpenVINO calls that load its CPU
    plugin (available_devices, compile_model). The plugin (2026.4) installs one on the thread that loads it
    and unmaps it when the plugin goes with its last Core and compiled model, which the server frees on
    another thread (a model stops on a worker thread): the main thread's next signal (uvicorn re-raises the
    SIGTERM it stopped on) then had no stack to run on, and the kernel ended `temper serve` with SIGSEGV
    instead of exit 0. Where libc has no sigaltstack (not Linux), nothing is done."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        saved = _SignalStack()
        kept = libc.sigaltstack(None, ctypes.byref(saved)) == 0
    except (OSError, AttributeError):
        kept = False
    try:
        yield
    finally:
        if kept:
            libc.sigaltstack(ctypes.byref(saved), None)


def _names(ports: list[Any], onnx_names: list[str]) -> list[str]:
    """Each port's name as the ONNX graph spells it: a port carries every name of its tensor, and
    get_any_name() may pick another than the graph's input or output name."""
    return [next((n for n in onnx_names if n in port.get_names()), port.get_any_name()) for port in ports]


def settings_of(compiled: Any) -> OpenVinoSettings:
    """The settings a compiled model really runs with, read back from it."""
    precision = compiled.get_property("INFERENCE_PRECISION_HINT")
    name = precision.get_type_name() if hasattr(precision, "get_type_name") else str(precision)
    return OpenVinoSettings(inference_precision=_TYPE_NAMES.get(name, name),
                            num_threads=int(compiled.get_property("INFERENCE_NUM_THREADS")),
                            num_streams=int(compiled.get_property("NUM_STREAMS")),
                            performance_hint=str(compiled.get_property("PERFORMANCE_HINT")))


def open_engine(model: Path, precision: str, threads: int, streams: int = 1,
                hint: Literal["LATENCY", "THROUGHPUT"] = "LATENCY") -> OpenVinoSession:
    """`model` compiled for `precision` (f32, bf16) on `threads` threads, `streams` streams and the
    performance `hint`; EnvironmentProblem when the compiled model computes in another precision than asked
    (OpenVINO asked for BF16 on a CPU without it quietly computes FP32: that figure must never be called BF16)."""
    session = OpenVinoSession(model, OpenVinoSettings(inference_precision=precision, num_threads=threads,
                                                      num_streams=streams, performance_hint=hint))
    if session.settings.inference_precision != precision:
        raise EnvironmentProblem(f"OpenVINO was asked to compute in {precision} but the compiled model reports "
                                 f"{session.settings.inference_precision}: this CPU does not run {precision} natively")
    return session


# The session search's rows: two streams split the threads between two inference requests; the batcher runs
# one batch at a time, so this wins only where a stream's share of the cores runs a batch nearly as fast.
# INFERENCE_PRECISION_HINT is not a row: f32 and bf16 are rows of the provider table of their own, so a BF16
# model is gated on its own outputs and recorded as BF16, never as FP32.
SEARCH_ROWS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("one-thread", {"num_threads": 1}),
    ("two-streams", {"num_streams": 2, "performance_hint": "THROUGHPUT"}),
)
TRITON_BACKEND = "openvino"  # Triton's OpenVINO backend: a backend, not a platform; it reads the ONNX file itself


class OpenVino:
    """OpenVINO's CPU plugin: one row per inference precision (openvino: f32, openvino-bf16: bf16)."""

    name = "openvino"
    packages: tuple[str, ...] = ("openvino",)
    settings = OpenVinoSettings

    def available(self, provider: Provider, host: HostProfile | None = None) -> None:
        """OpenVINO installed and offering its CPU device; a BF16 row only on a CPU whose profile reports native
        BF16 (decided by its ISA flags, never by its name)."""
        info = PROVIDERS[provider]
        key = "validate.throughput.providers"
        if version() is None:
            raise EnvironmentProblem(f"{key}: '{provider}' needs OpenVINO, which is not installed: {info.install}")
        if DEVICE not in devices():
            raise EnvironmentProblem(f"{key}: '{provider}': OpenVINO offers no CPU device here (devices: "
                                     f"{', '.join(devices()) or 'none'})")
        host = host or profile()
        if info.host_flags and not (host.features_known and any(f in host.features for f in info.host_flags)):
            seen = " ".join(host.features) if host.features_known else "unknown"
            raise EnvironmentProblem(f"{key}: '{provider}' needs a CPU with native BF16 "
                                     f"({' or '.join(info.host_flags)}); this host ({host.cpu}) reports {seen}")

    def devices(self) -> list[str]:
        return devices()

    def defaults(self, provider: Provider) -> OpenVinoSettings:
        """The row's precision on all usable cores, one stream, the latency hint."""
        precision = PROVIDERS[provider].precision
        assert precision is not None, "every OpenVINO row names its precision"
        return OpenVinoSettings(inference_precision=precision, num_threads=usable_cores())

    def open(self, model: Path, provider: Provider, settings: EngineSettings) -> OpenVinoSession:
        """Compiled in the row's precision, checked on the compiled model (open_engine)."""
        assert isinstance(settings, OpenVinoSettings), "OpenVINO runs OpenVinoSettings"
        precision = PROVIDERS[provider].precision
        assert precision is not None, "every OpenVINO row names its precision"
        return open_engine(model, precision, settings.num_threads, settings.num_streams, settings.performance_hint)

    def settings_of(self, session: Session) -> OpenVinoSettings:
        assert isinstance(session, OpenVinoSession), "an OpenVINO row's session"
        return session.settings

    def serve(self, model: Path, provider: Provider | None, recorded: EngineSettings | None,
              providers: list[str] | None, name: str) -> tuple[Session, Provider, OpenVinoSettings]:
        """The precision the bundle's row names, the threads, streams and hint runtime.json records (all usable
        cores when it records none, or more threads than this host has)."""
        assert provider is not None, "a bundle served on OpenVINO names its row"
        cores = usable_cores()
        settings = recorded if isinstance(recorded, OpenVinoSettings) else self.defaults(provider)
        if settings.num_threads > cores:
            settings = settings.with_threads(cores)
        session = self.open(model, provider, settings)
        live = session.settings
        log.info("%s: engine=%s inference_precision=%s threads=%d streams=%d hint=%s", name, provider,
                 live.inference_precision, live.num_threads, live.num_streams, live.performance_hint)
        return session, provider, live

    def bound_call(self, session: Session, feed: dict[str, np.ndarray], provider: Provider) -> Callable[[], None]:
        assert isinstance(session, OpenVinoSession), "an OpenVINO row's session"
        return session.bound_call(feed)

    def search_rows(self, provider: Provider) -> tuple[tuple[str, dict[str, Any]], ...]:
        return SEARCH_ROWS

    def triton(self, provider: Provider, settings: EngineSettings | None) -> dict[str, Any]:
        """Triton's OpenVINO backend (its README's parameters): threads, streams and the performance hint as
        measured, and HINT_BF16 for a BF16 row. The backend documents no key that holds a CPU to FP32, so an
        `openvino` (FP32) pick computes FP32 there only on a CPU without native BF16 (triton_differences)."""
        measured = settings if isinstance(settings, OpenVinoSettings) else None
        values = {"PERFORMANCE_HINT": measured.performance_hint if measured else "LATENCY",
                  "NUM_STREAMS": str(measured.num_streams if measured else 1)}
        if measured is not None:
            values["INFERENCE_NUM_THREADS"] = str(measured.num_threads)
        if PROVIDERS[provider].precision == "bf16":
            values["HINT_BF16"] = "YES"
        return {"backend": TRITON_BACKEND, "parameters": values}

    def triton_kind(self, provider: Provider, asked: str) -> str:
        if asked == "KIND_GPU":
            raise ValueError(f"selected on {provider}, OpenVINO's CPU engine; use KIND_CPU or KIND_AUTO")
        return "KIND_CPU"

    def triton_differences(self, provider: Provider, settings: EngineSettings | None = None) -> list[str]:
        if PROVIDERS[provider].precision != "f32":
            return []
        return ["Triton's OpenVINO backend has no setting that keeps the CPU in FP32: on a CPU with native BF16 "
                "(avx512_bf16, amx_bf16) it computes this FP32-gated model in BF16"]
