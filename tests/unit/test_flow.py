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


def test_a_gated_run_exits_1_on_a_build_error_but_not_on_a_rejected_build():
    report = Report.model_validate(sample_report())
    assert Outcome(Path("o"), report, build_errors=["int8"]).exit_code == 1
    assert Outcome(Path("o"), report, build_errors=[]).exit_code == 0  # rejected, or allowed: a failed gate only


def test_step_failed_kind_tells_a_raised_build_from_a_rejected_one():
    from temper.artifacts.core.errors import EnvironmentProblem, StepFailed

    def raised(cause: BaseException | None) -> StepFailed:
        try:
            if cause is None:
                raise StepFailed("fp16: NaN on a real batch")
            raise StepFailed("quantize: failed") from cause
        except StepFailed as exc:
            return exc

    assert raised(FileNotFoundError("model.onnx")).kind == "error"
    assert raised(None).kind == "rejected"
    assert raised(EnvironmentProblem("no GPU")).kind == "error"
    assert raised(StepFailed("export: outputs differ")).kind == "rejected"  # a step's verdict, passed on
