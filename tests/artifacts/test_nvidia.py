"""The GPU pre-flight on recorded nvidia-smi output and installed-package layouts, on a machine without a GPU: the
parser, the driver floor, no nvidia-smi at all, TensorRT absent or of the wrong major. The end-to-end cases run the
real readers in a subprocess whose PYTHONPATH holds a GPU build's files and whose PATH holds a recorded nvidia-smi
(tests/artifacts/fake_site.py); a test whose premise is a real GPU skips without one."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from temper.artifacts.core import host, nvidia
from temper.artifacts.core.errors import EnvironmentProblem
from temper.artifacts.core.nvidia import Card, Facts, check_driver, parse_smi, read_facts, require_gpu
from tests.artifacts.fake_site import (
    A100_R570,
    H200,
    T4_R535,
    distribution,
    environment,
    gpu_onnxruntime,
    nvidia_smi,
)

H200_FACTS = Facts(cards=(Card("NVIDIA H200", "9.0", "580.159.03"),), smi=None, onnxruntime_gpu="1.31.1",
                   cuda="13.0", cuda_runtime="13.0.96", cudnn="9.20.0.48", tensorrt="10.16.1.11", tensorrt_needed=10)
PROBE = ("import json, sys; from temper.artifacts.core import nvidia, host\n"
         "facts = nvidia.read_facts(); p = host.profile()\n"
         "out = {'summary': nvidia.summary(facts), 'host': p.model_dump(), 'refused': {}}\n"
         "for provider in ('cpu', 'cuda', 'tensorrt'):\n"
         "    try:\n        nvidia.require_gpu(provider)\n"
         "    except nvidia.EnvironmentProblem as exc:\n        out['refused'][provider] = str(exc)\n"
         "print(json.dumps(out))\n")


def test_parse_smi_reads_name_capability_and_driver() -> None:
    assert parse_smi(H200) == [Card("NVIDIA H200", "9.0", "580.159.03")]
    assert parse_smi(A100_R570) == [Card("NVIDIA A100-SXM4-80GB", "8.0", "570.124.06")] * 2
    assert parse_smi("NVIDIA RTX 6000 Ada, Generation, 8.9, [N/A]\n") == [Card("NVIDIA RTX 6000 Ada, Generation",
                                                                               "8.9", None)]
    assert parse_smi("") == [] and parse_smi("\n") == []


def test_a_driver_below_cuda_13s_floor_is_refused_in_one_line_naming_driver_cuda_and_cudnn() -> None:
    old = dataclasses.replace(H200_FACTS, cards=tuple(parse_smi(A100_R570)))
    with pytest.raises(EnvironmentProblem) as refused:
        check_driver(old)
    line = str(refused.value)
    assert line.startswith("NVIDIA driver 570.124.06 is older than 580, the oldest that runs CUDA 13.0"), line
    assert "onnxruntime-gpu 1.31.1" in line and "cuDNN 9.20.0.48" in line and "\n" not in line
    with pytest.raises(EnvironmentProblem, match="NVIDIA driver 570.124.06"):
        require_gpu("cuda", old)
    check_driver(H200_FACTS)  # 580 is the floor itself
    require_gpu("cuda", H200_FACTS)
    require_gpu("tensorrt", H200_FACTS)


def test_the_floor_follows_the_cuda_the_runtime_was_built_for() -> None:
    assert H200_FACTS.floor() == 580
    assert dataclasses.replace(H200_FACTS, cuda="12.8").floor() == 525
    assert dataclasses.replace(H200_FACTS, cuda=None, onnxruntime_gpu="1.29.0").floor() == 580
    assert dataclasses.replace(H200_FACTS, cuda=None, onnxruntime_gpu="1.20.1").floor() is None
    on_cuda12 = dataclasses.replace(H200_FACTS, cuda="12.8", cards=tuple(parse_smi(T4_R535)))
    check_driver(on_cuda12)  # 535 runs CUDA 12


def test_no_gpu_and_no_gpu_build_are_each_one_line() -> None:
    no_gpu = read_facts(smi=lambda: None)
    assert no_gpu.cards == () and no_gpu.smi == "nvidia-smi is not on PATH (no NVIDIA driver)"
    assert read_facts(smi=lambda: "").smi == "nvidia-smi lists no GPU"

    def broken() -> str:
        raise OSError("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")

    assert read_facts(smi=broken).smi.startswith("nvidia-smi failed (NVIDIA-SMI has failed")
    with pytest.raises(EnvironmentProblem, match=r"^provider 'cuda' needs an NVIDIA GPU: nvidia-smi is not on PATH"):
        require_gpu("cuda", dataclasses.replace(H200_FACTS, cards=(), smi=no_gpu.smi))
    if nvidia.build_info().get("cuda_version") is None:  # this environment's ONNX Runtime is a CPU build
        cpu_build = (r"^provider 'cuda' \(CUDAExecutionProvider\) needs onnxruntime-gpu, and this environment has "
                     r"onnxruntime \(a CPU build\): to install onnxruntime-gpu: pip uninstall")
        with pytest.raises(EnvironmentProblem, match=cpu_build):
            require_gpu("cuda")
    require_gpu("cpu")
    require_gpu("openvino")


def test_tensorrt_absent_or_of_another_major_is_refused() -> None:
    with pytest.raises(EnvironmentProblem) as absent:
        require_gpu("tensorrt", dataclasses.replace(H200_FACTS, tensorrt=None))
    assert str(absent.value).startswith("provider 'tensorrt' needs TensorRT 10, and none is installed: pip install "
                                        "'temper-ml[tensorrt]'"), absent.value
    wrong = r"^TensorRT 11\.4\.0\.106 is installed, but onnxruntime-gpu 1\.31\.1's TensorRT provider loads TensorRT 10 "
    with pytest.raises(EnvironmentProblem, match=wrong + r"\(libnvinfer\.so\.10\)"):
        require_gpu("tensorrt", dataclasses.replace(H200_FACTS, tensorrt="11.4.0.106"))
    require_gpu("cuda", dataclasses.replace(H200_FACTS, tensorrt=None))  # CUDA alone needs no TensorRT


def _probe(tmp_path: Path, smi: str | None, tensorrt: str | None = None) -> dict:
    site, bin_folder = tmp_path / "site", tmp_path / "bin"
    gpu_onnxruntime(site)
    distribution(site, "onnxruntime-gpu", "1.31.1")
    distribution(site, "nvidia-cudnn-cu13", "9.20.0.48")
    distribution(site, "nvidia-cuda-runtime", "13.0.96")
    if tensorrt:
        distribution(site, "tensorrt-cu13", tensorrt)
    nvidia_smi(bin_folder, smi)
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120,
                          env=environment(site, bin_folder))
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_gpu_install_read_end_to_end_from_its_files_and_nvidia_smi(tmp_path: Path) -> None:
    out = _probe(tmp_path, H200, tensorrt="10.16.1.11")
    assert out["refused"] == {}, out["refused"]
    assert out["summary"] == ("NVIDIA H200 (sm 9.0); NVIDIA driver 580.159.03; onnxruntime-gpu 1.31.1 built for CUDA "
                              "13.0; CUDA runtime 13.0.96; cuDNN 9.20.0.48; TensorRT 10.16.1.11")
    profile = host.HostProfile.model_validate(out["host"])
    assert [(g.name, g.compute_capability) for g in profile.gpus] == [("NVIDIA H200", "9.0")]
    assert (profile.nvidia_driver, profile.cuda, profile.cudnn, profile.onnxruntime_gpu, profile.tensorrt) == (
        "580.159.03", "13.0", "9.20.0.48", "1.31.1", "10.16.1.11")
    assert profile.summary().endswith("; GPU NVIDIA H200 (sm 9.0), driver 580.159.03, CUDA 13.0, cuDNN 9.20.0.48, "
                                      "onnxruntime-gpu 1.31.1, TensorRT 10.16.1.11")


def test_a_driver_below_the_floor_through_the_version_reader(tmp_path: Path) -> None:
    out = _probe(tmp_path, A100_R570)
    assert set(out["refused"]) == {"cuda", "tensorrt"}
    assert out["refused"]["cuda"] == (
        "NVIDIA driver 570.124.06 is older than 580, the oldest that runs CUDA 13.0, which onnxruntime-gpu 1.31.1 was "
        "built for (cuDNN 9.20.0.48 found): upgrade the NVIDIA driver to 580 or newer")


def test_no_nvidia_smi_and_no_tensorrt_through_the_version_reader(tmp_path: Path) -> None:
    out = _probe(tmp_path, None)
    assert out["refused"]["cuda"].startswith("provider 'cuda' needs an NVIDIA GPU: nvidia-smi is not on PATH")
    assert "built for CUDA 13.0 (cuDNN 9.20.0.48)" in out["refused"]["cuda"]
    assert out["host"]["gpus"] == [] and out["host"]["nvidia_driver"] is None and out["host"]["cuda"] == "13.0"
    out = _probe(tmp_path / "h200", H200)
    assert "cuda" not in out["refused"]
    assert out["refused"]["tensorrt"].startswith("provider 'tensorrt' needs TensorRT 10, and none is installed")


def test_a_cpu_host_records_no_gpu_stack() -> None:
    if shutil.which("nvidia-smi") or nvidia.build_info().get("cuda_version"):
        pytest.skip("this host has an NVIDIA driver or a GPU build of ONNX Runtime")
    p = host.profile()
    assert p.gpus == [] and p.gpu_stack() == ""
    assert (p.nvidia_driver, p.cuda, p.cudnn, p.onnxruntime_gpu, p.tensorrt) == (None,) * 5


def test_this_hosts_gpu_passes_its_own_preflight() -> None:
    if shutil.which("nvidia-smi") is None:
        pytest.skip("no NVIDIA GPU here (nvidia-smi is not on PATH): the pre-flight's GPU side runs on a GPU host")
    facts = read_facts()
    assert facts.cards and facts.driver, nvidia.summary(facts)
    if facts.onnxruntime_gpu is None:
        pytest.skip(f"no onnxruntime-gpu installed here: {nvidia.summary(facts)}")
    require_gpu("cuda", facts)
