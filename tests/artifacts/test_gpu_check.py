"""The device check's CPU dry run (benchmarks/gpu_check.py --provider cpu --quick), so that its run on a lent GPU
is never its first: one subprocess, as the GPU call runs it, then the JSON's shape and that its figures are
real and consistent (every ratio recomputed from the figures beside it in the same file)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks.gpu_check_torch import torchvision_error

ROOT = Path(__file__).resolve().parents[2]
BATCHES = ["1", "32", "256"]


@pytest.mark.slow
def test_the_cpu_dry_run_writes_measured_figures(tmp_path: Path) -> None:
    skip_resnet = torchvision_error()  # PyPI's torchvision does not import beside the pinned torch
    models = "digits,resnet18" if skip_resnet else "digits"  # resnet18 at batch 256 on 2 cores: too long for CI
    proc = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--provider", "cpu", "--quick",
                           "--models", models, "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    found = json.loads((tmp_path / "gpu_check.json").read_text())
    assert (tmp_path / "gpu-check-digits.yaml").is_file()  # the recipe copy, beside the JSON
    assert found["provider"] == "cpu" and found["quick"] is True
    assert found["host"]["profile"]["usable_cores"] >= 1 and found["host"]["onnxruntime_import"]["version"]
    if skip_resnet:
        assert found["models"]["resnet18"] == {"skipped": skip_resnet}
    digits = found["models"]["digits"]
    _temper_run(digits["temper"])
    _ceiling(digits)
    _served(digits["serve"], digits["temper"])
    _graphs(digits["cuda_graphs"], digits["serve"]["bundle"])


def _temper_run(run: dict[str, Any]) -> None:
    assert run["exit_code"] == 0
    pairs = run["pairs"]
    assert set(pairs) == {"baseline", "fp16", "int8-static"}  # one engine on the CPU: no model@engine pairs
    for key, pair in pairs.items():
        assert set(pair["batches"]) == set(BATCHES), key
        for figure in pair["batches"].values():
            assert figure["samples_per_s"] > 0 and figure["runs"] >= 1
            if key != "baseline":
                low, high = figure["speedup_interval"]
                assert 0 < low <= figure["speedup"] <= high
        if key != "baseline":
            assert pair["fidelity"] and pair["cosine_min"] == min(f["cosine"] for f in pair["fidelity"])
            assert -1 <= pair["cosine_min"] <= 1 and pair["drop"] is not None
    selected = run["selected"]
    assert selected["pair"] in pairs and selected["why"]
    assert selected["passed"] == bool(selected["passing_pairs"])
    assert run["selected_batches"] == {b: {k: v for k, v in f.items() if k not in ("speedup", "speedup_interval")}
                                       for b, f in pairs[selected["pair"]]["batches"].items()}


def _ceiling(model: dict[str, Any]) -> None:
    figures = model["torch_ceiling"]["figures"]
    assert model["torch_ceiling"]["timer"] == "time.perf_counter"
    for precision in ("fp32", "bf16-autocast"):
        assert all(figures[precision][b]["samples_per_s"] > 0 for b in BATCHES)
    for b in BATCHES:
        ratio = model["ratio_to_torch"][b]
        ours = model["temper"]["selected_batches"][b]["samples_per_s"]
        fp32, bf16 = figures["fp32"][b]["samples_per_s"], figures["bf16-autocast"][b]["samples_per_s"]
        assert (ratio["temper_samples_per_s"], ratio["torch_fp32"], ratio["torch_bf16"]) == (ours, fp32, bf16)
        assert ratio["ratio_fp32"] == pytest.approx(ours / fp32)
        assert ratio["ratio_bf16"] == pytest.approx(ours / bf16)
        assert ratio["ratio_best"] == pytest.approx(ours / max(fp32, bf16))


def _served(serve: dict[str, Any], run: dict[str, Any]) -> None:
    reference = serve["engine_reference"]
    assert reference["pair"] == run["selected"]["pair"]
    assert reference["samples_per_s"] == run["selected_batches"][str(reference["batch"])]["samples_per_s"]
    assert serve["bundle"]["engine"] == run["selected"]["engine"] and serve["bundle"]["max_batch_size"] == 64
    points = {(p["protocol"], p["clients"]): p for p in serve["points"]}
    assert set(points) == {(protocol, n) for protocol in ("http-binary", "grpc") for n in (1, 32, 64)}
    for point in points.values():
        assert point["errors"] == {} and point["requests"] > 0 and point["req_per_s"] > 0
        assert point["req_per_s"] == pytest.approx(point["requests"] / point["seconds"])
        assert point["ratio_to_engine"] == pytest.approx(point["req_per_s"] / reference["samples_per_s"])
        assert point["avg_batch"] >= 1
    assert any(line.startswith("process_resident_memory_bytes") for line in serve["metrics_memory_lines"])
    soak = serve["soak"]
    assert soak["requests"] == 200 and soak["errors"] == 0
    samples = soak["samples"]
    assert [samples[0]["requests"], samples[-1]["requests"]] == [0, 200]
    assert len(samples) == 11 and all(s["rss_mib"] > 0 for s in samples)  # the start, every 20 requests, the end
    assert isinstance(soak["rss_mib_flat"], bool) and "gpu_mib_flat" not in soak


def _graphs(graphs: dict[str, Any], bundle: dict[str, Any]) -> None:
    """Off and on read back as asked, answer alike and are both timed, with on's speedup interval over off."""
    assert graphs["model"] == str(Path(bundle["model_folder"]) / "model.onnx")
    assert graphs["settings"]["off"].get("cuda_graph", False) is False and graphs["settings"]["on"]["cuda_graph"]
    assert set(graphs["batches"]) == set(BATCHES)
    for entry in graphs["batches"].values():
        assert entry["replay_check"] == "passed" and entry["equal"] and entry["max_abs_difference"] == 0
        assert entry["off_samples_per_s"] > 0 and entry["on_samples_per_s"] > 0
        low, high = entry["speedup_interval"]
        assert 0 < low <= entry["speedup"] <= high and entry["rounds"] >= 5
