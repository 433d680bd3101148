"""Selection on the paired intervals through the console script (issue 33.2), with the rounds' timings made
by hand so the verdict is the rule's, not the host's: fp16 and int8 both beat the baseline; int8 has the
higher median samples/s, but their paired interval holds 1.0, so they tie and the more faithful fp16 wins;
the report names the tie and every selection has a reason."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from onnx import helper

from temper.validators import benches
from temper.validators.rounds import Bench
from temper.validators.throughput import Measurement
from tests.helpers import STATIC_INT8, save_graph, write_recipe
from tests.unit.reports import read_report

# samples/s per round: int8's median (345) beats fp16's (340), but round by round they trade places
SPEEDS = {"baseline": [100, 100, 100, 100, 100], "int8-static": [300, 360, 345, 390, 330],
          "fp16": [340, 320, 365, 335, 350]}


def _fake_interleave(bench: Bench, sessions, paths, sample, layout, timing, undecided, more=None) -> Bench:
    for name in sessions:
        for round_, speed in enumerate(SPEEDS[name]):
            bench.slices[name][round_] = Measurement(
                provider=paths[name][1], batch_size=bench.batch_size, runs=10, samples=10 * bench.batch_size,
                seconds=10 * bench.batch_size / speed, samples_per_s=float(speed),
                latency_ms={"p50": 1.0, "p90": 1.0, "p95": 1.0, "p99": 1.0}, peak_rss_mb=100.0, gpu_mem_mb=None,
                session={"intra_op_threads": 1, "spinning": False, "graph_optimization": "all"})
    return bench


def _recipe(folder: Path) -> Path:
    rng = np.random.default_rng(0)
    w = rng.normal(size=(8, 6)).astype(np.float32)
    save_graph(folder / "mm.onnx", [helper.make_node("MatMul", ["x", "w"], ["y"])], {"x": ["batch", 8]},
               {"y": ["batch", 6]}, {"w": w}, name="mm")
    model = {"onnx": "mm.onnx", "inputs": [{"name": "x", "shape": ["batch", 8]}], "outputs": ["y"]}
    return write_recipe(folder, "ties", model, {"x": rng.random((64, 8), dtype=np.float32)},
                        {"int8-static": STATIC_INT8, "fp16": {"steps": [{"fp16": {}}]}},
                        {"fidelity": {"cosine_min": 0.9},
                         "throughput": {"batch_sizes": [4], "duration_s": 0.1, "warmup_s": 0.01}})


def test_pairs_tied_on_their_paired_interval_go_to_the_more_faithful(temper, tmp_path, monkeypatch):
    monkeypatch.setattr(benches, "interleave", _fake_interleave)
    out = tmp_path / "out"
    result = temper("run", _recipe(tmp_path), "--output", out)
    assert result.code == 0, result.stderr
    report = read_report(out)
    fp16, int8 = report["candidates"]["fp16"], report["candidates"]["int8-static"]
    assert fp16["passed"] and int8["passed"]
    medians = {n: c["throughput"][0]["samples_per_s"] for n, c in report["candidates"].items()}
    assert medians["int8-static"] > medians["fp16"]  # what selection ranked on before
    assert report["selected"] == "fp16" and report["passed"]
    (tie,) = report["ties"]
    assert tie["pair"] == "int8-static" and tie["speedup_interval"][0] < 1.0 < tie["speedup_interval"][1]
    assert tie["fidelity"] < min(f["cosine"] for f in fp16["fidelity"])
    reason = report["selection_reason"]
    assert reason.startswith("fp16 passed every gate and is ") and "tied on speed with int8-static" in reason
    assert "the more faithful pair is selected" in reason
    assert reason in " ".join(result.stdout.split()) or reason[:60] in result.stdout
    assert f"**passed** — selected `fp16`: {reason}" in (out / "report.md").read_text()
