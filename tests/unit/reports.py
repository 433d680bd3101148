"""A hand-built report.json that the schema accepts, for the tests of what is made from one; and
the one way tests read a written report.json: checked against the shipped schema."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema

SCHEMA_FILE = Path(__file__).resolve().parents[2] / "validators" / "report.schema.json"
SCHEMA = json.loads(SCHEMA_FILE.read_text())

INCONCLUSIVE = ("inconclusive: noise; speedup at batch 8 on cpu 1.10x [0.90, 1.30] (95%, 6 rounds, 30 s budget) "
                "straddles 1.2; counted as a failure (validate.throughput.inconclusive)")
REASON = "no candidate passed every gate: int8 missed throughput.cpu.b8, fp16 missed accuracy"


def measurement(samples_per_s: float, **extra: Any) -> dict[str, Any]:
    """A batch-8 CPU throughput entry; a candidate's adds `speedup` and `speedup_interval`."""
    return {"provider": "cpu", "batch_size": 8, "runs": 100, "samples": 800, "seconds": 2.0,
            "samples_per_s": samples_per_s, "latency_ms": {"p50": 1.25, "p90": 1.5, "p95": 1.6, "p99": 2.125},
            "peak_rss_mb": 300.0, "gpu_mem_mb": None, "rounds": 6, "spread_pct": 4.5,
            "load": {"load_1m": 1.5, "steal_pct": 0.0, "busy_pct": 55.0},
            "session": {"intra_op_threads": 2, "spinning": False, "graph_optimization": "all"}, "threads": 2,
            **extra}


def gate(name: str, passed: bool, detail: str, verdict: str = "", interval: list[float] | None = None,
         measured: float | None = 1.0, budget: float | None = 1.0, kind: str = "accuracy",
         provider: str | None = None, batch_size: int | None = None) -> dict[str, Any]:
    """One gate as report.json holds it (validators.gates.Gate.as_dict)."""
    return {"name": name, "passed": passed, "measured": measured, "budget": budget, "detail": detail,
            "verdict": verdict or ("pass" if passed else "fail"), "interval": interval, "kind": kind,
            "provider": provider, "batch_size": batch_size}


CENSUS = {"eligible": 3, "quantized": 3, "fp16": 0, "fp32": 0, "in_subgraphs": 0, "quantized_in_subgraphs": 0,
          "dynamic": 0, "by_op": {"Conv": {"quantized": 2, "fp16": 0, "fp32": 0},
                                  "MatMul": {"quantized": 1, "fp16": 0, "fp32": 0}}}


DEFAULT_SETTINGS = {"intra_op_threads": 2, "spinning": False, "graph_optimization": "all"}
SESSION_SEARCH = {  # the baseline searched on cpu: one thread faster on its interval, extended slower at batch 1
    "provider": "cpu", "default": DEFAULT_SETTINGS, "kept": "one-thread",
    "settings": {**DEFAULT_SETTINGS, "intra_op_threads": 1}, "ranking_batch_size": 8, "confidence": 0.95,
    "budget_s": 4.0, "seconds": 5.2, "cut_short": [], "enough_s": None, "cached": False,
    "load": {"load_1m": 1.2, "steal_pct": 0.0, "busy_pct": 99.0},
    "trials": [
        {"name": "one-thread", "changes": {"intra_op_threads": 1},
         "settings": {**DEFAULT_SETTINGS, "intra_op_threads": 1}, "verdict": "kept",
         "speedups": [{"batch_size": 8, "speedup": 1.4, "interval": [1.2, 1.6], "rounds": 5}]},
        {"name": "extended", "changes": {"graph_optimization": "extended"},
         "settings": {**DEFAULT_SETTINGS, "graph_optimization": "extended"}, "verdict": "slower",
         "speedups": [{"batch_size": 8, "speedup": 0.5, "interval": [0.4, 0.6], "rounds": 5}]},
    ],
}


COMPOSITION = {
    "batch_size": 16, "probes": 16, "padded": [],
    "compositions": [{"name": name, "detail": name, "cosine_to_alone_min": cos, "cosine_to_alone_median": cos,
                      "rel_l2_to_alone_max": rel, "cosine_to_baseline": 0.999, "row_cosine_to_baseline_min": 0.99}
                     for name, cos, rel in (("alone", 1.0, 0.0), ("random", 0.9999, 0.005), ("loudest", 0.999, 0.01))],
    "worst": "loudest", "dependent": True, "dependent_above": 1e-4,
}


def sample_report() -> dict[str, Any]:
    """Two candidates, neither passing: int8's speed gate is inconclusive, fp16 misses accuracy."""
    fidelity = {"name": "logits", "slice": None, "max_abs": 0.0123456, "mean_abs": 0.001, "p99_abs": 0.01,
                "max_rel": 0.05, "rel_l2": 0.002, "cosine": 0.9999, "nonfinite": 0, "within_tolerance": False,
                "worst_row": None}
    report = {
        "schema_version": 6, "recipe": "toy", "metric": "top1",
        "baseline": {"metric": 0.95, "engine": "cpu", "throughput": [measurement(4000.0)], "batch_composition": None},
        "allowed_drop": 0.02,
        "candidates": {
            "int8": {"model": "int8", "engine": "cpu", "engine_precision": None,
                     "passed": False, "bytes": 12 * 1024, "metric": 0.94, "drop": 0.01, "precision": "int8-static",
                     "intended_precision": "int8-static", "census": CENSUS, "engine_census": CENSUS,
                     "gates": [gate("accuracy", True, "top1 drop 0.01 <= 0.02"),
                               gate("throughput.cpu.b8", False, INCONCLUSIVE, "inconclusive", [0.9, 1.3], 1.1, 1.2,
                                    "throughput", "cpu", 8)],
                     "fidelity": [fidelity],
                     "throughput": [measurement(4400.0, speedup=1.1, speedup_interval=[0.9, 1.3])],
                     "tuning": None, "batch_composition": copy.deepcopy(COMPOSITION)},
            "fp16": {"model": "fp16", "engine": "cpu", "engine_precision": None,
                     "passed": False, "bytes": 24 * 1024, "metric": 0.9, "drop": 0.05, "precision": "fp16",
                     "intended_precision": "fp16",
                     "census": {**CENSUS, "quantized": 0, "fp16": 3, "dynamic": 0,
                                "by_op": {"Conv": {"quantized": 0, "fp16": 2, "fp32": 0},
                                          "MatMul": {"quantized": 0, "fp16": 1, "fp32": 0}}},
                     "engine_census": None,
                     "gates": [gate("accuracy", False, "top1 drop 0.05 > 0.02")],
                     "fidelity": [{**fidelity, "cosine": 0.98}], "throughput": [], "tuning": None,
                     "batch_composition": None},
        },
        "not_built": {},
        "select": "fastest-passing", "selected": "baseline", "selected_engine": "cpu", "selected_pair": "baseline",
        "passed": False, "searches": {}, "session_searches": {"baseline": [copy.deepcopy(SESSION_SEARCH)]},
        "host": {"cpu": "Test CPU 9000", "arch": "x86_64", "features": ["avx512_vnni", "avx2"], "features_known": True,
                 "usable_cores": 2, "logical_cpus": 4, "memory_gib": 7.5, "onnxruntime": "1.32.0",
                 "providers": ["CPUExecutionProvider"], "gpus": [{"name": "Test GPU", "compute_capability": "9.0"}],
                 "openvino": "2026.4.1", "nvidia_driver": "580.159.03", "cuda": "13.0", "cudnn": "9.20.0.48",
                 "onnxruntime_gpu": "1.31.1", "tensorrt": "10.16.1.11"},
        "target": {"target": "arm64", "preset": "arm64-int8", "reason": "the recipe's target"},
        "speed_policy": {"min_speedup": 1.2, "gated_batch_sizes": [8], "confidence": 0.95, "max_duration_s": 30.0,
                         "inconclusive": "fail"},
        "selection_reason": REASON, "ties": [], "engine_disagreements": [],
    }
    jsonschema.validate(report, SCHEMA)  # every test reads a report the CI contract allows
    return report


def read_report(output: Path) -> dict[str, Any]:
    """A run's report.json, after checking it against the CI contract (validators/report.schema.json)."""
    report = json.loads((output / "report.json").read_text())
    jsonschema.validate(report, SCHEMA)
    return report
