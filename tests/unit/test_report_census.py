"""report.md's graph census table and the fallback's floor, from a hand-built report the schema accepts."""

from __future__ import annotations

import jsonschema

from temper.validators.report import markdown
from tests.unit.reports import SCHEMA, sample_report


def test_the_census_table_shows_what_each_graph_is_and_marks_a_label_it_contradicts():
    report = sample_report()
    fp16 = report["candidates"]["fp16"]
    fp16.update(precision="fp32", census={**fp16["census"], "fp16": 0, "fp32": 3, "in_subgraphs": 3,
                                          "by_op": {"MatMul": {"quantized": 0, "fp16": 0, "fp32": 3}}})
    jsonschema.validate(report, SCHEMA)
    lines = markdown(report).splitlines()
    assert "| int8 | int8-static | int8-static | 3 | 3 | 3 | 0 | 0 | 0 | Conv 2/0/0, MatMul 1/0/0 |" in lines
    assert "| fp16 | fp32 | **fp16** | 3 | 0 | — | 0 | 3 | 3 | MatMul 0/0/3 |" in lines


def test_a_candidate_that_did_not_build_has_no_census_row():
    report = sample_report()
    report["candidates"]["fp16"].update(precision=None, census=None, bytes=None, metric=None, drop=None)
    jsonschema.validate(report, SCHEMA)
    lines = markdown(report).splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("## Graph census"))
    table = lines[start + 4: lines.index("", start + 4)]  # title, blank, header, rule, then the rows
    assert [row.split(" | ")[0] for row in table] == ["| int8"]


def test_the_fallback_section_gives_the_floor_and_each_trials_quantized_nodes():
    report = sample_report()
    trial = {"kind": "plain", "float_nodes": [], "metric": 0.9, "drop": 0.05, "cosine": 0.99, "samples_per_s": None,
             "passed": False, "quantized": 40, "configuration": {}}
    tried = {"changes": {"per_channel": True}, "metric": 0.92, "drop": 0.04, "cosine": 0.995, "quantized": 40,
             "passed": False}
    report["candidates"]["int8"]["tuning"] = {
        "metric": "top1", "baseline_metric": 0.95, "allowed_drop": 0.02, "met": False, "best": 1, "max_trials": 12,
        "min_quantized": 0.5, "floor": 20, "floor_reached": True, "configuration": {"per_channel": True},
        "configurations": [tried],
        "trials": [trial, {**trial, "kind": "cumulative", "float_nodes": ["a", "b"], "drop": 0.03, "quantized": 21,
                           "configuration": {"per_channel": True}}],
        "ranking": []}
    jsonschema.validate(report, SCHEMA)
    lines = markdown(report).splitlines()
    assert ("Floor: every trial keeps at least 20 quantized nodes (0.5 of the plain model's); the search reached it, "
            "so the budget is **not reachable in INT8** beyond it.") in lines
    assert "| 1 (kept) | cumulative | 2 | 21 | 0.9000 | +0.0300 | 0.9900 | — | missed |" in lines
    assert "| per_channel: True | 40 | 0.9200 | +0.0400 | 0.9950 | missed |" in lines
    assert "The node search started from: per_channel: True." in lines
