"""A folder laid out as site-packages would be after pip installed what a GPU host has, put first on a
subprocess's PYTHONPATH: importlib.metadata and importlib.util then find its distributions and its `onnxruntime`
package exactly as they would installed ones (the real lookups, nothing mocked). And an `nvidia-smi` that prints
recorded output, first on PATH."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

# nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader, one line per GPU. The H200 line is
# what this workplace's lent machine showed (name, compute capability 9.0, driver 580.159.03, .library/device/
# KINDS.md, 2026-10-27); the others are in the same format, for drivers below CUDA 13's floor (580).
H200 = "NVIDIA H200, 9.0, 580.159.03\n"
A100_R570 = "NVIDIA A100-SXM4-80GB, 8.0, 570.124.06\nNVIDIA A100-SXM4-80GB, 8.0, 570.124.06\n"
T4_R535 = "Tesla T4, 7.5, 535.230.02\n"
# onnxruntime-gpu 1.31.1's onnxruntime/capi/build_and_package_info.py, as its manylinux x86_64 wheel ships it
GPU_BUILD_INFO = "package_name = 'onnxruntime-gpu'\n__version__ = '1.31.1'\ncuda_version = '13.0'\n"


def distribution(site: Path, name: str, version: str) -> None:
    """NAME-VERSION.dist-info with the METADATA importlib.metadata reads."""
    folder = site / f"{name.replace('-', '_')}-{version}.dist-info"
    folder.mkdir(parents=True)
    (folder / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def gpu_onnxruntime(site: Path, build_info: str = GPU_BUILD_INFO, tensorrt_links: int | None = 10) -> None:
    """An `onnxruntime` package holding what the GPU pre-flight reads: its build info and the TensorRT provider
    library's soname reference (the bytes a real libonnxruntime_providers_tensorrt.so holds among others)."""
    capi = site / "onnxruntime" / "capi"
    capi.mkdir(parents=True)
    (site / "onnxruntime" / "__init__.py").write_text("raise ImportError('a fake onnxruntime: read, never imported')\n")
    (capi / "build_and_package_info.py").write_text(build_info)
    if tensorrt_links is not None:
        (capi / "libonnxruntime_providers_tensorrt.so").write_bytes(
            b"\x7fELF\0" + f"libcublas.so.13\0libnvinfer.so.{tensorrt_links}\0libcudnn.so.9\0".encode())


def nvidia_smi(bin_folder: Path, output: str | None, exit_code: int = 0) -> None:
    """An nvidia-smi that prints `output` (recorded) and exits with `exit_code`; None: no nvidia-smi at all."""
    bin_folder.mkdir(parents=True, exist_ok=True)
    if output is None:
        return
    script = bin_folder / "nvidia-smi"
    lines = " ".join(f"'{line}'" for line in output.splitlines())  # printf is the shell's own: PATH may hold no cat
    script.write_text(f"#!/bin/sh\nprintf '%s\\n' {lines}\nexit {exit_code}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


def environment(site: Path, bin_folder: Path | None = None) -> dict[str, str]:
    """This process's environment with `site` first on PYTHONPATH and, given, `bin_folder` as the only PATH entry
    besides the interpreter's own folder (so the host's own nvidia-smi, if any, is not found)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    if bin_folder is not None:
        env["PATH"] = os.pathsep.join([str(bin_folder), str(Path(sys.executable).parent)])
    return env
