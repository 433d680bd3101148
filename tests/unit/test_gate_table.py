"""The console's gate table (`temper run`, `temper validate`) as an 80-column terminal shows it."""

from __future__ import annotations

import io

from rich.console import Console

from temper.pipeline.cli.build import _gate_table
from temper.validators.report_model import Report
from tests.unit.reports import sample_report


def _rendered(report: dict, width: int = 80) -> list[str]:
    console = Console(width=width, record=True, file=io.StringIO())
    console.print(_gate_table(Report.model_validate(report)))
    return console.export_text().splitlines()


def test_a_file_py_function_metric_leaves_every_verdict_whole() -> None:
    report = sample_report()
    report["metric"] = "recipes/digits_data.py:top1_accuracy_of_the_logits"
    report["candidates"]["int8"]["passed"] = True
    lines = _rendered(report)
    rows = {name: next(line for line in lines if f"│ {name} " in line) for name in ("int8", "fp16")}
    assert "│ pass " in rows["int8"] and "│ FAIL " in rows["fp16"], "\n".join(lines)
    assert "…" not in "\n".join(lines)  # nothing cut: the long header and gate names wrap instead
    assert any("top1_accuracy" in line for line in lines)  # the header is the function's name
    caption = " ".join(" ".join(lines).split())
    assert "baseline recipes/digits_data.py:top1_accuracy_of_the_logits 0.9500" in caption  # the caption names it whole
