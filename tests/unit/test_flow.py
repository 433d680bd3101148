"""pipeline.flow's verdict-to-exit-code rules, on hand-built reports and run results (no model is built)."""

from __future__ import annotations

from pathlib import Path

from temper.pipeline.flow import Outcome, required_missed
from temper.pipeline.runner import CandidateOutcome, RunResult
from temper.validators.report_model import Report
from tests.unit.reports import sample_report


def _result(*errors: str | None) -> RunResult:
    return RunResult(baseline=[], candidates=[CandidateOutcome(f"c{i}", [], error) for i, error in enumerate(errors)])


def test_gated_run_exits_0_unless_a_required_candidate_missed():
    report = Report.model_validate(sample_report())  # int8 and fp16 both failed; the baseline is selected
    assert required_missed(report, None) == [] and Outcome(Path("o"), report).exit_code == 0
    assert required_missed(report, ["int8"]) == ["int8"]
    assert Outcome(Path("o"), report, missed=["int8"]).exit_code == 1


def test_a_searched_candidate_passes_when_one_trial_does():
    raw = sample_report()
    raw["candidates"]["int8"]["passed"] = True
    raw["searches"] = {"q": {"trials": ["fp16", "int8"], "combinations": 2}}
    report = Report.model_validate(raw)
    assert required_missed(report, ["q", "fp16"]) == ["fp16"]


def test_ungated_run_exits_1_when_any_candidate_failed_to_build():
    assert Outcome(Path("o"), None, _result(None, None)).exit_code == 0
    assert Outcome(Path("o"), None, _result(None, "export failed")).exit_code == 1
    assert Outcome(Path("o"), None, _result()).exit_code == 1  # nothing built is not a success
