"""The one table of execution providers a recipe, `temper bench` and the serving runtime may name.

Adding a provider is a row here (and a value of `Provider`): the recipe schema, the speed gates'
pre-flight and sessions, report.json, the serving runtime's engine choice and the Triton export's
instance kind all read this table. It sits in artifacts/, the bottom layer, because the serving
runtime and the MLflow model ship only artifacts/.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Provider = Literal["cpu", "cuda", "tensorrt"]  # recipe, report.json and `temper bench` spell providers so


@dataclass(frozen=True)
class ProviderInfo:
    name: Provider
    ort: str  # ONNX Runtime's execution provider
    gpu: bool  # runs on a GPU: Triton's KIND_GPU, IO binding, no CPU thread choice
    then: tuple[str, ...] = ()  # providers chained after it, for the nodes it does not take
    install: str = ""  # what to install when this onnxruntime lacks it


CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
TENSORRT = "TensorrtExecutionProvider"

PROVIDERS: dict[Provider, ProviderInfo] = {
    "cpu": ProviderInfo("cpu", CPU, gpu=False),
    "cuda": ProviderInfo("cuda", CUDA, gpu=True, install="install onnxruntime-gpu on a machine with an NVIDIA GPU"),
    # CUDA after TensorRT keeps the nodes TensorRT does not take on the GPU rather than the CPU.
    "tensorrt": ProviderInfo("tensorrt", TENSORRT, gpu=True, then=(CUDA,),
                             install="install onnxruntime-gpu and TensorRT on a machine with an NVIDIA GPU"),
}
BEST_FIRST: tuple[Provider, ...] = ("tensorrt", "cuda", "cpu")  # the serving runtime's choice, when none is asked


def named(ort_provider: str) -> Provider:
    """The recipe's name for an ONNX Runtime provider a session runs on ("cpu" for any other)."""
    return next((info.name for info in PROVIDERS.values() if info.ort == ort_provider), "cpu")
