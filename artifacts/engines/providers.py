"""The one table of rows a recipe, `temper bench` and the serving runtime may name (`providers:`).

A row is a runtime (its `engine`: artifacts/engines/) on a device in a precision. Adding a row is a line
here (and a value of `Provider`): the recipe schema, the speed gates' pre-flight and sessions, report.json,
the serving runtime's engine choice and the Triton export's instance kind all read this table. Most rows
are ONNX Runtime execution providers;
`openvino` and `openvino-bf16` are OpenVINO's own runtime on the CPU (artifacts/engines/openvino.py),
one row per inference precision, since BF16 compute is a precision of its own and is gated as one.
It sits in artifacts/, the bottom layer, because the serving runtime and the MLflow model ship only
artifacts/.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from temper.artifacts.core.nvidia import INSTALL_GPU, INSTALL_TENSORRT

# recipe, report.json and `temper bench` spell engines so
Provider = Literal["cpu", "cuda", "tensorrt", "openvino", "openvino-bf16"]
EngineName = Literal["onnxruntime", "openvino"]


@dataclass(frozen=True)
class ProviderInfo:
    name: Provider
    ort: str  # ONNX Runtime's execution provider ("" for an engine that is not ONNX Runtime)
    gpu: bool  # runs on a GPU: Triton's KIND_GPU, IO binding, no CPU thread choice
    then: tuple[str, ...] = ()  # providers chained after it, for the nodes it does not take
    install: str = ""  # what to install when this host lacks it
    engine: EngineName = "onnxruntime"  # the runtime that runs it, and the package a bundle's model requires
    precision: str | None = None  # what the engine computes float ops in (OpenVINO's INFERENCE_PRECISION_HINT)
    host_flags: tuple[str, ...] = ()  # ISA features of which the host profile must report one (none: any host)


CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
TENSORRT = "TensorrtExecutionProvider"
OPENVINO_INSTALL = "pip install 'temper-ml[openvino]'"
# one ONNX Runtime build at a time: both ship `import onnxruntime` (artifacts/core/versions.py refuses both)
GPU_INSTALL, TENSORRT_INSTALL = INSTALL_GPU, INSTALL_TENSORRT
BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # native BF16 arithmetic; without them OpenVINO computes FP32

PROVIDERS: dict[Provider, ProviderInfo] = {
    "cpu": ProviderInfo("cpu", CPU, gpu=False),
    "cuda": ProviderInfo("cuda", CUDA, gpu=True, install=GPU_INSTALL),
    # CUDA after TensorRT keeps the nodes TensorRT does not take on the GPU rather than the CPU.
    "tensorrt": ProviderInfo("tensorrt", TENSORRT, gpu=True, then=(CUDA,),
                             install=TENSORRT_INSTALL),
    "openvino": ProviderInfo("openvino", "", gpu=False, install=OPENVINO_INSTALL, engine="openvino", precision="f32"),
    "openvino-bf16": ProviderInfo("openvino-bf16", "", gpu=False, install=OPENVINO_INSTALL, engine="openvino",
                                  precision="bf16", host_flags=BF16_FLAGS),
}
# The serving runtime's choice among ONNX Runtime's providers, when a bundle names none.
BEST_FIRST: tuple[Provider, ...] = ("tensorrt", "cuda", "cpu")


def named(ort_provider: str) -> Provider:
    """The recipe's name for an ONNX Runtime provider a session runs on ("cpu" for any other)."""
    return next((info.name for info in PROVIDERS.values() if info.ort and info.ort == ort_provider), "cpu")


def provider_named(name: str) -> Provider:
    """`name` as a row of the table: the checked way from a string (a report key, a JSON field) to a Provider."""
    for provider in PROVIDERS:
        if provider == name:
            return provider
    raise ValueError(f"{name!r} is not a provider: one of {', '.join(PROVIDERS)}")
