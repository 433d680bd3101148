"""validators.report: report.md and junit.xml from a hand-built report.json that the schema accepts."""

from __future__ import annotations

import copy
import json

import jsonschema
import pytest

from temper.validators.report import junit, markdown, speedup_text
from temper.validators.report_model import Report
from tests.unit.reports import INCONCLUSIVE, REASON, SCHEMA, gate, sample_report

CHOSEN = "int8 passed every gate and is 1.40x [1.36, 1.44] the baseline at batch 8 on cpu (95%): faster on its interval"


def test_baseline_selection_states_its_reason():
    assert f"**no candidate passed** — selected `baseline`: {REASON}" in markdown(sample_report()).splitlines()


def test_a_passing_report_names_its_selection():
    report = sample_report()
    report.update(passed=True, selected="int8", selected_pair="int8", selection_reason=CHOSEN)
    report["candidates"]["int8"]["passed"] = True
    jsonschema.validate(report, SCHEMA)
    assert f"**passed** — selected `int8`: {CHOSEN}" in markdown(report).splitlines()  # a reason for every selection


def test_host_section_says_where_figures_were_measured():
    lines = markdown(sample_report()).splitlines()
    host = lines[lines.index("## Host"):]
    assert "- CPU: Test CPU 9000 (x86_64); INT8/FP16 features: avx512_vnni, avx2" in host
    assert "- cores used: 2 (of 4 logical CPUs); memory 7.5 GiB; GPU: Test GPU (compute capability 9.0)" in host
    assert "- onnxruntime 1.32.0 with CPUExecutionProvider" in host and "- openvino 2026.4.1" in host
    assert ("- NVIDIA stack: driver 580.159.03, CUDA 13.0, cuDNN 9.20.0.48, onnxruntime-gpu 1.31.1, TensorRT "
            "10.16.1.11") in host
    assert "- quantize `preset: auto` → `arm64-int8` for target `arm64`: the recipe's target" in host
    assert any(line.startswith("- speed was measured on this host, not on the target") for line in host)


def test_host_section_without_known_features_gpus_or_target():
    report = sample_report()
    report["host"].update(features=[], features_known=False, memory_gib=None, gpus=[], nvidia_driver=None, cuda=None,
                          cudnn=None, onnxruntime_gpu=None, tensorrt=None)
    report["target"] = None
    jsonschema.validate(report, SCHEMA)
    text = markdown(report)
    assert "INT8/FP16 features: unknown (the OS lists none)" in text
    assert "memory unknown; GPU: none" in text and "preset: auto" not in text and "NVIDIA stack" not in text


def test_candidate_table_rows():
    lines = markdown(sample_report()).splitlines()
    assert "| baseline | — | — | 0.9500 | — | — |" in lines
    assert "| int8 | FAIL | 12 KiB | 0.9400 | +0.0100 (max 0.0200) | throughput.cpu.b8 |" in lines
    assert "| fp16 | FAIL | 24 KiB | 0.9000 | +0.0500 (max 0.0200) | accuracy |" in lines


def test_session_settings_section_shows_each_row_its_verdict_and_intervals():
    lines = markdown(sample_report()).splitlines()
    section = lines[lines.index("## Session settings"):]
    assert "| baseline | cpu | default | — | — | search took 5.2 s of 4 s |" in section
    assert "| baseline | cpu | one-thread | intra_op_threads: 1 | kept | b8 1.40x [1.20, 1.60] |" in section
    assert "| baseline | cpu | extended | graph_optimization: extended | slower | b8 0.50x [0.40, 0.60] |" in section


def test_a_search_the_budget_cut_short_says_where_and_what_budget_would_do():
    report = sample_report()
    report["session_searches"]["baseline"][0].update(cut_short=[8], enough_s=31.0)
    jsonschema.validate(report, SCHEMA)
    lines = markdown(report).splitlines()
    assert ("| baseline | cpu | default | — | — | search took 5.2 s of 4 s; the budget cut the rounds short at "
            "batch 8: raise session_search_s to about 31 |") in lines


def test_no_session_settings_section_without_a_search():
    report = sample_report()
    report["session_searches"] = {}
    assert "## Session settings" not in markdown(report)


def test_inconclusive_speed_gate_shows_its_interval():
    lines = markdown(sample_report()).splitlines()
    assert f"- `int8` throughput.cpu.b8: {INCONCLUSIVE}" in lines
    row = next(line for line in lines if line.startswith("| int8 | cpu | 8 |"))
    assert "| 1.10x [0.90, 1.30] |" in row and "| 6 | 4.5% |" in row
    baseline = next(line for line in lines if line.startswith("| baseline | cpu | 8 |"))
    assert "| 4,000 | 1.00x |" in baseline and "| 1.5 / 0% / 55% |" in baseline


def test_speedup_text_without_an_interval():
    assert speedup_text({"speedup": 1.234, "speedup_interval": None}) == "1.23x"
    assert speedup_text({"speedup": 1.234, "speedup_interval": [1.2, 1.3]}) == "1.23x [1.20, 1.30]"


def test_fidelity_table_lists_every_candidate_and_output():
    lines = markdown(sample_report()).splitlines()
    start = lines.index("## Fidelity (per output, vs the baseline)")
    assert lines[start + 2] == ("| candidate | output | cosine | worst row | rel L2 | max abs | mean abs | p99 abs | "
                                "NaN/Inf |")
    assert lines[start + 4] == "| int8 | logits | 0.999900 | — | 0.002 | 0.01235 | 0.001 | 0.01 | 0 |"
    assert lines[start + 5] == "| fp16 | logits | 0.980000 | — | 0.002 | 0.01235 | 0.001 | 0.01 | 0 |"


def test_no_metric_and_no_throughput_leave_their_columns_and_sections_out():
    report = copy.deepcopy(sample_report())
    report.update(metric=None, allowed_drop=None)
    report["baseline"] = {"metric": None, "engine": "cpu", "throughput": []}
    for c in report["candidates"].values():
        c.update(metric=None, drop=None, throughput=[])
    report["speed_policy"] = None
    jsonschema.validate(report, SCHEMA)
    text = markdown(report)
    assert "| candidate | verdict | size | failed gates |" in text and "## Throughput" not in text


@pytest.mark.parametrize("failed", [0, 1, 3])
def test_junit_counts_failed_gates(failed):
    report = sample_report()
    gates = [gate(f"g{i}", i >= failed, f"detail {i}") for i in range(3)]
    report["candidates"] = {"only": {**report["candidates"]["int8"], "gates": gates}}
    jsonschema.validate(report, SCHEMA)
    root = junit(report).getroot()
    suite = root.find("testsuite")
    assert root.get("tests") == suite.get("tests") == "3"
    assert root.get("failures") == suite.get("failures") == str(failed)
    assert suite.get("name") == "temper.toy"
    assert len(suite.findall("testcase/failure")) == failed


def test_junit_case_per_gate_with_the_failure_detail():
    root = junit(sample_report()).getroot()
    cases = root.findall("testsuite/testcase")
    assert [(c.get("classname"), c.get("name")) for c in cases] == [
        ("toy.int8", "accuracy"), ("toy.int8", "throughput.cpu.b8"), ("toy.fp16", "accuracy")]
    assert root.get("failures") == "2"  # an inconclusive gate counted as a failure is one
    failure = cases[1].find("failure")
    assert failure.get("message") == INCONCLUSIVE and failure.get("type") == "gate"
    assert json.loads(failure.text)["interval"] == [0.9, 1.3]
    assert cases[0].find("failure") is None


@pytest.mark.parametrize("speeds, labels", [
    ((1.2, 2.4), ["0.0", "0.5", "1.0", "1.5", "2.0", "2.5"]),  # under 3 samples/s: whole numbers read 0, 0, 1, 1...
    ((4000.0, 4400.0), ["0", "1,000", "2,000", "3,000", "4,000"]),
])
def test_throughput_plot_y_ticks_show_the_real_values(speeds, labels):
    from temper.validators.report_plots import _throughput_figure

    report = sample_report()
    report["baseline"]["throughput"][0]["samples_per_s"] = speeds[0]
    report["candidates"]["int8"]["throughput"][0]["samples_per_s"] = speeds[1]
    figure = _throughput_figure(Report.model_validate(report))
    figure.canvas.draw()  # the formatter writes the labels at draw time, as savefig does
    (axes,) = figure.axes
    shown = [t.get_text() for t in axes.get_yticklabels() if 0 <= t.get_position()[1] <= axes.get_ylim()[1]]
    assert shown[: len(labels)] == labels, shown
    assert len(set(shown)) == len(shown)  # no two ticks read the same


def test_an_int8_pair_whose_engine_runs_part_of_it_in_float_says_so_where_it_serves():
    """The engine census (validators/engine_census.py): in the census table, and on the serving line of a
    selected pair, ONNX Runtime running fewer compute nodes in INT8 than the graph quantized."""
    from temper.validators.report import engine_line
    from tests.unit.reports import CENSUS

    report = sample_report()
    int8 = report["candidates"]["int8"]
    int8["engine_census"] = {**CENSUS, "quantized": 2, "fp32": 1,
                             "by_op": {"Conv": {"quantized": 2, "fp16": 0, "fp32": 0},
                                       "MatMul": {"quantized": 0, "fp16": 0, "fp32": 1}}}
    jsonschema.validate(report, SCHEMA)
    assert "| int8 | int8-static | int8-static | 3 | 3 | **2** | 0 | 0 | 0 |" in markdown(report)
    assert "| fp16 | fp16 | fp16 | 3 | 0 | — |" in markdown(report)  # nothing quantized: not asked
    report.update(selected="int8", selected_pair="int8", passed=True, selection_reason=CHOSEN)
    line = engine_line(Report.model_validate(report))
    assert line.endswith("; ONNX Runtime runs 2 of the graph's 3 quantized compute nodes in INT8 (1 compute on "
                         "dequantized values in float)"), line
    int8["engine_census"] = CENSUS  # all of them: nothing to say
    assert "ONNX Runtime runs" not in engine_line(Report.model_validate(report))
