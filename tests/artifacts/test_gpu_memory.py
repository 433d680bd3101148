"""GPU memory is read from the NVIDIA driver's own figures, and a GPU bundle's CUDA arena is bounded by what
its gates saw it hold. The reader is fed nvidia-smi's recorded CSV (the format of its --query-* output); the
bound goes through a real report.json model. A host without nvidia-smi reads nothing, never an error."""

from __future__ import annotations

import shutil

import pytest

from temper.artifacts.engines import gpu_memory
from temper.artifacts.engines.onnxruntime import SessionSettings, needed_limit_mb
from temper.validators import report_model
from tests.unit.reports import measurement, sample_report

# nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits: a server and two workers,
# one row the driver cannot attribute
COMPUTE_APPS = "4211, 612\n4260, 1830\n4261, 1826\n[N/A], [N/A]\n"


def test_the_driver_rows_are_read_per_process():
    held = gpu_memory.by_process(gpu_memory.parse(COMPUTE_APPS))
    assert held == {4211: 612.0, 4260: 1830.0, 4261: 1826.0}


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this host has nvidia-smi: the premise is none")
def test_without_nvidia_smi_nothing_is_read():
    assert gpu_memory.used_mb([1]) is None and gpu_memory.devices() is None


def test_the_arena_limit_is_what_the_gates_saw_with_headroom_in_64_mib_steps():
    assert needed_limit_mb(1000.0) == 1536 and needed_limit_mb(64.0) == 128 and needed_limit_mb(1.0) == 64


def test_a_gpu_pairs_bundle_records_the_limit_and_a_cpu_pairs_none():
    data = sample_report()
    cuda = {"intra_op_threads": 2, "spinning": False, "graph_optimization": "all"}
    data["baseline"]["throughput"] = [measurement(100.0, provider="cuda", gpu_mem_mb=900.0, session=cuda),
                                      measurement(90.0, provider="cuda", gpu_mem_mb=1100.0, session=cuda)]
    report = report_model.Report.model_validate(data)
    settings = report.session_of("baseline")
    assert isinstance(settings, SessionSettings) and settings.gpu_mem_limit_mb == needed_limit_mb(1100.0) == 1664
    cpu_pair = next(iter(report.candidates))
    recorded = report.session_of(cpu_pair)
    assert recorded is None or getattr(recorded, "gpu_mem_limit_mb", None) is None
