"""A model on OpenVINO's CPU plugin, behind the run interface an ONNX Runtime session offers.

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

import threading
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

import numpy as np
import onnx
from pydantic import BaseModel, ConfigDict, Field, PositiveInt

from temper.artifacts.errors import EnvironmentProblem

INSTALL = "pip install 'temper-ml[openvino]'"
DEVICE = "CPU"
Precision = Literal["f32", "bf16"]
_TYPE_NAMES = {"float32": "f32", "f32": "f32", "bfloat16": "bf16", "bf16": "bf16", "float16": "f16", "f16": "f16"}


class OpenVinoSettings(BaseModel):
    """How an OpenVINO compiled model is built: what a speed figure was measured with and what serves.
    Read back from the compiled model itself (settings_of)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    inference_precision: str = Field(description="INFERENCE_PRECISION_HINT as the compiled model reports it "
                                                 "(f32, bf16): the precision the engine computes float ops in")
    num_threads: PositiveInt = Field(description="INFERENCE_NUM_THREADS")
    num_streams: PositiveInt = Field(1, description="NUM_STREAMS: one stream, as one inference thread feeds it")
    performance_hint: Literal["LATENCY", "THROUGHPUT"] = Field("LATENCY", description="PERFORMANCE_HINT")

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
        if DEVICE not in core.available_devices:
            raise EnvironmentProblem(f"OpenVINO offers no {DEVICE} device here (devices: "
                                     f"{', '.join(core.available_devices) or 'none'})")
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
