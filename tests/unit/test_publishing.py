"""pipeline.publishing.metrics_of and flatten: the numbers and params MLflow gets from a report."""

from __future__ import annotations

import jsonschema

from temper.pipeline.publishing import flatten, metrics_of
from tests.unit.reports import SCHEMA, sample_report


def test_metrics_of_a_fullsample_report():
    assert metrics_of(sample_report()) == {
        "baseline.top1": 0.95,
        "baseline.cpu.b8.samples_per_s": 4000.0,
        "int8.passed": 0.0, "int8.top1": 0.94, "int8.drop": 0.01,
        "int8.fidelity.logits.cosine": 0.9999, "int8.fidelity.logits.max_abs": 0.0123456,
        "int8.cpu.b8.samples_per_s": 4400.0, "int8.cpu.b8.speedup": 1.1, "int8.cpu.b8.p99_ms": 2.125,
        "fp16.passed": 0.0, "fp16.top1": 0.9, "fp16.drop": 0.05,
        "fp16.fidelity.logits.cosine": 0.98, "fp16.fidelity.logits.max_abs": 0.0123456,
    }


def test_metrics_of_a_report_without_a_metric_or_measurements():
    report = sample_report()
    report.update(metric=None, allowed_drop=None, speed_policy=None)
    report["baseline"] = {"metric": None, "engine": "cpu", "throughput": []}
    for c in report["candidates"].values():
        c.update(metric=None, drop=None, throughput=[], fidelity=[])
    report["candidates"]["fp16"]["passed"] = True
    jsonschema.validate(report, SCHEMA)
    assert metrics_of(report) == {"int8.passed": 0.0, "fp16.passed": 1.0}


def test_every_metric_is_a_float_mlflow_accepts():
    assert all(isinstance(v, float) for v in metrics_of(sample_report()).values())


def test_flatten_makes_dotted_params():
    assert flatten({"a": {"b": 1, "c": {"d": [1, 2]}}, "e": None}) == {"a.b": 1, "a.c.d": [1, 2], "e": None}
    assert flatten(3) == {"": 3}
