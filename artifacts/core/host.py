"""What machine this is, as far as model speed and numerics care: the CPU and the ISA features
that decide INT8/FP16/BF16 kernels, the cores this process may really use, memory, ONNX
Runtime's providers and any NVIDIA GPU with the stack a GPU engine runs on (driver, CUDA, cuDNN,
onnxruntime-gpu, TensorRT: artifacts/core/nvidia.py reads them). Published with every speed figure, so a
number always says where it was measured; read again by `temper serve` to warn when the serving host
lacks what a bundle's speed was verified with. Imports nothing from the rest of temper but nvidia.py.

Every probe is best-effort: an unknown OS or CPU yields empty fields, never an exception.
"""

from __future__ import annotations

import contextlib
import math
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from pydantic import BaseModel, ConfigDict

from temper.artifacts.core import distributions, nvidia

# The features that decide which INT8/FP16/BF16 kernels ONNX Runtime can use, by the names
# Linux gives them in /proc/cpuinfo (x86 "flags", arm64 "Features").
X86_FEATURES = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx512_bf16",
                "avx512_fp16", "amx_int8", "amx_bf16", "amx_tile")
ARM_FEATURES = ("asimd", "asimddp", "i8mm", "bf16", "fphp", "asimdhp", "sve", "sve2")
# Plain names for the arm64 flags whose /proc name differs from the architecture's.
_ARM_NAMES = {"asimddp": "dotprod", "fphp": "fp16", "asimdhp": "asimd_fp16"}
VNNI = ("avx512_vnni", "avx_vnni", "amx_int8")  # any of these: u8 x s8 dot products without saturation


class Gpu(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    compute_capability: str | None = None


class HostProfile(BaseModel):
    """The machine a figure was measured on (report.json, manifest, MLflow tags, runtime.json)."""

    model_config = ConfigDict(extra="forbid")

    cpu: str  # vendor and model as the OS names it
    arch: str  # x86_64, aarch64, ...
    features: list[str]  # the speed/numerics-relevant ISA features present (plain names)
    features_known: bool  # False: the OS gave no feature list, so absence means nothing
    usable_cores: int  # CPU affinity and the container's quota, not the host's core count
    logical_cpus: int | None
    memory_gib: float | None
    onnxruntime: str | None
    providers: list[str]  # the execution providers this onnxruntime offers
    gpus: list[Gpu]
    openvino: str | None = None  # the installed OpenVINO runtime's version (the openvino engines), None: absent
    # The NVIDIA stack the cuda and tensorrt engines run on; each None where absent (a CPU host: all of them).
    nvidia_driver: str | None = None  # the NVIDIA driver's version (nvidia-smi)
    cuda: str | None = None  # the CUDA version the installed ONNX Runtime was built for (a GPU build's build info)
    cudnn: str | None = None  # cuDNN's version, as its nvidia-cudnn wheel installed it
    onnxruntime_gpu: str | None = None  # the onnxruntime-gpu distribution's version: the build `onnxruntime` is
    tensorrt: str | None = None  # TensorRT's version, from its wheels' metadata

    @property
    def x86(self) -> bool:
        return self.arch.lower() in ("x86_64", "amd64", "i686", "x86")

    @property
    def arm64(self) -> bool:
        return self.arch.lower() in ("aarch64", "arm64")

    @property
    def vnni(self) -> bool:
        return any(f in self.features for f in VNNI)

    def kernels(self) -> list[Any]:
        """What of this host a cached numeric result depends on: CPU, ISA and threads choose the kernels
        and their order of sums (pipeline.cache's outputs/ and ranges/ key on it)."""
        return [self.cpu, self.arch, self.features, self.usable_cores]

    def summary(self) -> str:
        """One line for logs and report headers."""
        features = " ".join(self.features) if self.features_known else "features unknown"
        gpus = "; GPU " + ", ".join(g.name + (f" (sm {g.compute_capability})" if g.compute_capability else "")
                                    for g in self.gpus) if self.gpus else "; no GPU"
        memory = f", {self.memory_gib:.0f} GiB" if self.memory_gib else ""
        openvino = f", openvino {self.openvino}" if self.openvino else ""
        return (f"{self.cpu} ({self.arch}: {features}), {self.usable_cores} usable cores{memory}, "
                f"onnxruntime {self.onnxruntime or '?'}{openvino}{gpus}{self.gpu_stack()}")

    def gpu_stack(self) -> str:
        """", driver 580.159.03, CUDA 13.0, cuDNN 9.20.0.48, onnxruntime-gpu 1.31.1, TensorRT 10.16.1.11": what
        of the NVIDIA stack is here (empty on a CPU host)."""
        parts = [("driver", self.nvidia_driver), ("CUDA", self.cuda), ("cuDNN", self.cudnn),
                 ("onnxruntime-gpu", self.onnxruntime_gpu), ("TensorRT", self.tensorrt)]
        return "".join(f", {name} {value}" for name, value in parts if value)

    def missing(self, other: HostProfile) -> list[str]:
        """Features `other` has that this host lacks; empty when either side's list is unknown."""
        if not (self.features_known and other.features_known) or self.arch != other.arch:
            return []
        return [f for f in other.features if f not in self.features]


def profile() -> HostProfile:
    """This host, probed now."""
    arch = platform.machine() or "unknown"
    cpu, flags = _cpuinfo()
    wanted = ARM_FEATURES if arch.lower() in ("aarch64", "arm64") else X86_FEATURES
    features = [_ARM_NAMES.get(f, f) for f in wanted if f in flags] if flags is not None else []
    ort_version, providers = _onnxruntime()
    stack = _nvidia()
    memory = None
    with contextlib.suppress(Exception):
        memory = round(psutil.virtual_memory().total / 2**30, 1)
    return HostProfile(cpu=cpu or platform.processor() or arch, arch=arch, features=features,
                       features_known=flags is not None, usable_cores=usable_cores(), logical_cpus=os.cpu_count(),
                       memory_gib=memory, onnxruntime=ort_version, providers=providers,
                       gpus=[Gpu(name=c.name, compute_capability=c.compute_capability) for c in stack.cards],
                       openvino=distributions.version_of("openvino"), nvidia_driver=stack.driver, cuda=stack.cuda,
                       cudnn=stack.cudnn, onnxruntime_gpu=stack.onnxruntime_gpu, tensorrt=stack.tensorrt)


def usable_cores() -> int:
    """Cores this process may run on: its CPU affinity, capped by a cgroup CPU quota (containers).

    `os.cpu_count()` counts the host's CPUs: in a container limited to 2 CPUs on a 64-core host it
    says 64, and 64 intra-op threads on 2 CPUs' worth of time thrash.
    """
    cores = os.cpu_count() or 1
    with contextlib.suppress(AttributeError, OSError):
        cores = len(os.sched_getaffinity(0))
    quota = _cgroup_quota()
    if quota is not None:
        cores = min(cores, max(1, math.ceil(quota)))
    return max(1, cores)


def _cgroup_quota(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """CPUs' worth of time the cgroup may use (v2 cpu.max, else v1 cfs quota/period); None: unlimited."""
    with contextlib.suppress(OSError, ValueError):
        limit, span = (root / "cpu.max").read_text().split()[:2]
        return None if limit == "max" else int(limit) / int(span)
    with contextlib.suppress(OSError, ValueError):
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return None if quota <= 0 or period <= 0 else quota / period
    return None


def _cpuinfo(path: Path = Path("/proc/cpuinfo")) -> tuple[str, set[str] | None]:
    """(CPU name, feature flags) from the first processor in /proc/cpuinfo; (``, None) without it."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "", None
    return parse_cpuinfo(text)


def parse_cpuinfo(text: str) -> tuple[str, set[str] | None]:
    """The CPU's name and flags from /proc/cpuinfo text (x86 `model name`/`flags`, arm64 `Features`)."""
    name, flags, implementer = "", None, ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip().lower(), value.strip()
        if key in ("model name", "hardware", "cpu model") and not name:
            name = value
        elif key in ("flags", "features") and flags is None:
            flags = set(value.split())
        elif key == "cpu implementer" and not implementer:
            implementer = value
        elif not key and flags is not None and name:
            break  # end of the first processor's block
    if not name and implementer:
        name = f"arm64 (implementer {implementer})"
    return name, flags


def _onnxruntime() -> tuple[str | None, list[str]]:
    try:
        import onnxruntime as ort
    except Exception:  # not installed, or a broken build: the profile still stands
        return None, []
    return getattr(ort, "__version__", None), list(ort.get_available_providers())


def _nvidia() -> nvidia.Facts:
    """NVIDIA GPUs (nvidia-smi: name, compute capability, driver) and the CUDA stack installed beside them."""
    try:
        return nvidia.read_facts()
    except Exception:  # a probe that breaks: the profile still stands, without the GPU side
        return nvidia.Facts((), "not read", None, None, None, None, None, None)


@dataclass(frozen=True)
class Load:
    """What else was running while something was timed: load average and CPU steal over a window."""

    load_1m: float | None  # run-queue average at the end of the window
    steal_pct: float | None  # % of CPU time the hypervisor gave to other guests during the window
    busy_pct: float | None  # % of all CPUs busy during the window (this process included)

    def as_dict(self) -> dict[str, float | None]:
        return {"load_1m": self.load_1m, "steal_pct": self.steal_pct, "busy_pct": self.busy_pct}


class LoadMeter:
    """Measures `Load` between construction and `read()`."""

    def __init__(self) -> None:
        self._start = _cpu_times()
        self._began = time.monotonic()

    def read(self) -> Load:
        end = _cpu_times()
        load = None
        with contextlib.suppress(OSError, AttributeError):
            load = round(os.getloadavg()[0], 2)
        if self._start is None or end is None:
            return Load(load, None, None)
        # Linux counts guest time inside user time as well: leave it out so nothing counts twice.
        delta = {k: max(0.0, end[k] - self._start[k]) for k in end if not k.startswith("guest")}
        total = sum(delta.values())
        if total <= 0:
            return Load(load, None, None)
        idle = delta.get("idle", 0.0) + delta.get("iowait", 0.0)
        return Load(load, round(100 * delta.get("steal", 0.0) / total, 2), round(100 * (total - idle) / total, 1))


def _cpu_times() -> dict[str, float] | None:
    try:
        return psutil.cpu_times()._asdict()
    except Exception:  # an OS psutil cannot read: the figure goes without its context
        return None
