"""The NVIDIA facts a GPU engine stands on, and the GPU pre-flight of the `cuda` and `tensorrt` providers.

What is read: each GPU's name, compute capability and the driver version (nvidia-smi); the CUDA version the
installed ONNX Runtime was built for (`onnxruntime/capi/build_and_package_info.py`, which GPU builds write:
onnxruntime-gpu 1.31.1 has `cuda_version = '13.0'` and no cuDNN entry); cuDNN and the CUDA runtime as the
nvidia-* wheels installed them (what `onnxruntime.preload_dlls()` loads); onnxruntime-gpu's and TensorRT's
versions (package metadata). Nothing here imports onnxruntime or tensorrt: reading the facts loads no
library, so a host profile costs one nvidia-smi call at most, and none on a host without it.

The reader is injectable: `read_facts(smi=...)` takes nvidia-smi's text from a function, so the tests run the
real parsing and the real refusals on recorded output, on a machine without a GPU. Imports nothing from the
rest of temper but its errors.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.metadata
import importlib.util
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from temper.artifacts.core.errors import EnvironmentProblem

GPU_PROVIDERS = {"cuda": "CUDAExecutionProvider", "tensorrt": "TensorrtExecutionProvider"}  # and their ORT names
QUERY = "name,compute_cap,driver_version"  # nvidia-smi --query-gpu fields, in the order parse_smi reads them
# The oldest NVIDIA driver branch that runs each CUDA major version (NVIDIA's CUDA toolkit release notes: CUDA 13.0
# needs >= 580.65.06 on Linux, CUDA 12.0 >= 525.60.13). onnxruntime-gpu is built for CUDA 13 since 1.27 on PyPI;
# 1.29 made the 580 floor bite (microsoft/onnxruntime#27944: an older driver fails at the first CUDA call).
DRIVER_FLOOR = {13: 580, 12: 525}
CUDA13_SINCE = (1, 29)  # without build information, an onnxruntime-gpu this new is taken as built for CUDA 13
# Python distributions that install TensorRT's libraries (PyPI's `tensorrt` is a stub that pulls tensorrt-cuNN).
TENSORRT = ("tensorrt-cu13", "tensorrt-cu12", "tensorrt", "tensorrt-cu13-libs", "tensorrt-cu12-libs", "tensorrt-libs")
INSTALL_GPU = ("to install onnxruntime-gpu: pip uninstall -y onnxruntime onnxruntime-gpu, then "
               "pip install 'temper-ml[gpu]'")
INSTALL_TENSORRT = "pip install 'temper-ml[tensorrt]' --extra-index-url https://pypi.nvidia.com"


@dataclass(frozen=True)
class Card:
    """One GPU as nvidia-smi names it."""

    name: str
    compute_capability: str | None
    driver: str | None


@dataclass(frozen=True)
class Facts:
    """The GPU stack of this host; every field None (or empty) where it is absent."""

    cards: tuple[Card, ...]
    smi: str | None  # why nvidia-smi gave no GPU (not on PATH, failed, listed none); None when it listed some
    onnxruntime_gpu: str | None  # the installed onnxruntime-gpu distribution's version
    cuda: str | None  # the CUDA version the installed ONNX Runtime was built for ("13.0"); None: a CPU build
    cuda_runtime: str | None  # the nvidia-cuda-runtime wheel's version (the libcudart it loads)
    cudnn: str | None  # the nvidia-cudnn-cuNN wheel's version
    tensorrt: str | None  # TensorRT's version from its wheels' metadata
    tensorrt_needed: int | None  # the TensorRT major ONNX Runtime's TensorRT provider links (libnvinfer.so.N)

    @property
    def driver(self) -> str | None:
        return next((c.driver for c in self.cards if c.driver), None)

    def floor(self) -> int | None:
        """The oldest driver branch the installed ONNX Runtime's CUDA needs; None: unknown or not a CUDA build."""
        if self.cuda:
            with contextlib.suppress(ValueError):
                return DRIVER_FLOOR.get(int(self.cuda.split(".")[0]))
        if self.onnxruntime_gpu and _release(self.onnxruntime_gpu) >= CUDA13_SINCE:
            return DRIVER_FLOOR[13]
        return None


def parse_smi(text: str) -> list[Card]:
    """The GPUs in `nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader` output.
    A name may hold commas: the last two fields are the capability and the driver. "[N/A]" reads as None."""
    cards = []
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 3:
            name, capability, driver = parts[0], (parts[1] if len(parts) > 1 else ""), ""
        else:
            name, capability, driver = ", ".join(parts[:-2]), parts[-2], parts[-1]
        if name:
            cards.append(Card(name, _known(capability), _known(driver)))
    return cards


def read_smi() -> str | None:
    """nvidia-smi's answer to QUERY, or None when it is not on PATH; raises OSError when it fails."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        done = subprocess.run([smi, f"--query-gpu={QUERY}", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=10, check=True)
    except subprocess.CalledProcessError as exc:  # "couldn't communicate with the NVIDIA driver", on stdout
        said = f"{exc.stdout or ''}\n{exc.stderr or ''}".strip()
        raise OSError(said.splitlines()[0] if said else f"exit {exc.returncode}") from exc
    except subprocess.SubprocessError as exc:
        raise OSError(str(exc)) from exc
    return done.stdout


def read_facts(smi: Callable[[], str | None] = read_smi) -> Facts:
    """This host's GPU stack, probed now (nvidia-smi through `smi`, the rest from installed packages)."""
    cards: list[Card] = []
    why = None
    try:
        text = smi()
    except OSError as exc:
        text, why = None, f"nvidia-smi failed ({_one_line(exc)})"
    if text is None:
        why = why or "nvidia-smi is not on PATH (no NVIDIA driver)"
    else:
        cards = parse_smi(text)
        why = None if cards else "nvidia-smi lists no GPU"
    cuda = build_info().get("cuda_version")
    major = cuda.split(".")[0] if cuda else "13"
    # CUDA 13 dropped the -cuNN suffix from the toolkit wheels' names; cuDNN keeps it
    suffix = "" if major.isdigit() and int(major) >= 13 else f"-cu{major}"
    runtime = _version(f"nvidia-cuda-runtime{suffix}")
    return Facts(cards=tuple(cards), smi=why, onnxruntime_gpu=_version("onnxruntime-gpu"), cuda=cuda,
                 cuda_runtime=runtime, cudnn=_version(f"nvidia-cudnn-cu{major}"),
                 tensorrt=next(filter(None, map(_version, TENSORRT)), None), tensorrt_needed=_tensorrt_needed())


def build_info() -> dict[str, str]:
    """The installed onnxruntime package's build_and_package_info.py (package_name, __version__, cuda_version
    in GPU builds), read as text: importing onnxruntime would load its libraries. Empty without one."""
    folder = _onnxruntime_folder()
    if folder is None:
        return {}
    try:
        tree = ast.parse((folder / "capi" / "build_and_package_info.py").read_text())
    except (OSError, SyntaxError, ValueError):
        return {}
    info = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            with contextlib.suppress(ValueError):
                info[node.targets[0].id] = str(ast.literal_eval(node.value))
    return info


def summary(facts: Facts) -> str:
    """One line for the console: the GPUs, the driver, and the CUDA, cuDNN, onnxruntime-gpu and TensorRT found."""
    gpus = ", ".join(c.name + (f" (sm {c.compute_capability})" if c.compute_capability else "")
                     for c in facts.cards) or f"no GPU ({facts.smi})"
    runtime = (f"onnxruntime-gpu {facts.onnxruntime_gpu or '?'} built for CUDA {facts.cuda or '?'}"
               if facts.onnxruntime_gpu or facts.cuda else "onnxruntime-gpu not installed")
    return "; ".join([gpus, f"NVIDIA driver {facts.driver or 'none'}", runtime,
                      f"CUDA runtime {facts.cuda_runtime or 'not installed'}", f"cuDNN {facts.cudnn or 'not found'}",
                      f"TensorRT {facts.tensorrt or 'not installed'}"])


def check_driver(facts: Facts) -> None:
    """EnvironmentProblem (one line naming the driver, CUDA and cuDNN found) when the driver is older than the floor
    of the CUDA the installed ONNX Runtime was built for; nothing when it is new enough or a floor is unknown."""
    floor, driver = facts.floor(), facts.driver
    if floor is None or driver is None:
        return
    try:
        branch = int(driver.split(".")[0])
    except ValueError:
        return  # a version nvidia-smi words otherwise: nothing to compare
    if branch < floor:
        cuda = f"CUDA {facts.cuda}" if facts.cuda else "CUDA 13"
        cudnn = f"cuDNN {facts.cudnn}" if facts.cudnn else "no cuDNN"
        raise EnvironmentProblem(
            f"NVIDIA driver {driver} is older than {floor}, the oldest that runs {cuda}, which onnxruntime-gpu "
            f"{facts.onnxruntime_gpu or '?'} was built for ({cudnn} found): upgrade the NVIDIA driver to {floor} "
            "or newer")


def require_gpu(provider: str, facts: Facts | None = None) -> None:
    """The GPU pre-flight of the `cuda` and `tensorrt` providers: a CUDA build of ONNX Runtime, an NVIDIA GPU, a
    driver at or above its CUDA's floor and, for tensorrt, the TensorRT its provider links. EnvironmentProblem
    (exit 3, one line) otherwise; any other provider passes. `facts` defaults to this host, read now."""
    if provider not in GPU_PROVIDERS:
        return
    facts = read_facts() if facts is None else facts
    if facts.cuda is None and facts.onnxruntime_gpu is None:
        runtime = build_info().get("package_name") or "no ONNX Runtime"
        raise EnvironmentProblem(f"provider '{provider}' ({GPU_PROVIDERS[provider]}) needs onnxruntime-gpu, and this "
                                 f"environment has {runtime} "
                                 f"(a CPU build): {INSTALL_GPU}")
    if not facts.cards:
        raise EnvironmentProblem(f"provider '{provider}' needs an NVIDIA GPU: {facts.smi}; onnxruntime-gpu "
                                 f"{facts.onnxruntime_gpu or '?'} is built for CUDA {facts.cuda or '?'} "
                                 f"(cuDNN {facts.cudnn or 'not found'})")
    check_driver(facts)
    if provider == "tensorrt":
        needed = f"TensorRT {facts.tensorrt_needed}" if facts.tensorrt_needed else "TensorRT"
        if facts.tensorrt is None:
            raise EnvironmentProblem(f"provider 'tensorrt' needs {needed}, and none is installed: {INSTALL_TENSORRT}, "
                                     "or leave tensorrt out of the providers")
        if facts.tensorrt_needed is not None and _release(facts.tensorrt)[:1] != (facts.tensorrt_needed,):
            raise EnvironmentProblem(
                f"TensorRT {facts.tensorrt} is installed, but onnxruntime-gpu {facts.onnxruntime_gpu or '?'}'s "
                f"TensorRT provider loads {needed} (libnvinfer.so.{facts.tensorrt_needed}): {INSTALL_TENSORRT}")


def _tensorrt_needed() -> int | None:
    """The libnvinfer.so.N ONNX Runtime's TensorRT provider library links (1 MB; read only where it exists)."""
    folder = _onnxruntime_folder()
    if folder is None:
        return None
    with contextlib.suppress(OSError):
        found = re.search(rb"libnvinfer\.so\.(\d+)", (folder / "capi" / "libonnxruntime_providers_tensorrt.so")
                          .read_bytes())
        return int(found.group(1)) if found else None
    return None


def _onnxruntime_folder() -> Path | None:
    with contextlib.suppress(ImportError, ValueError):
        spec = importlib.util.find_spec("onnxruntime")  # a top-level package: found, not imported
        if spec is not None and spec.origin:
            return Path(spec.origin).parent
    return None


def _version(distribution: str) -> str | None:
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        return importlib.metadata.version(distribution)
    return None


def _release(version: str) -> tuple[int, ...]:
    """The leading numbers of a version ("1.31.1" -> (1, 31, 1); "10.16.1.11.post1" -> (10, 16, 1, 11))."""
    numbers = []
    for part in version.split("."):
        digits = re.match(r"\d+", part)
        if digits is None:
            break
        numbers.append(int(digits.group()))
    return tuple(numbers)


def _known(value: str) -> str | None:
    return None if not value or value.startswith("[") else value  # "[N/A]", "[Not Supported]"


def _one_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
