"""The burst fallback's backup in a run's output folder is the fastest pair that passed every gate on the selected
engine, other than the model being served: serving the baseline of a run whose int8 passed takes int8 as its
backup (it used to leave out the selected model whatever was served, and found none)."""

from __future__ import annotations

import json
from pathlib import Path

from temper.pipeline.outputs import backup_of
from temper.validators import report_model
from tests.unit.reports import measurement, sample_report


def _output(tmp_path: Path, rates: dict[str, float], selected: str) -> Path:
    data = sample_report()
    for name, rate in rates.items():
        figure = measurement(rate, speedup=1.5, speedup_interval=[1.2, 1.8])
        data["candidates"][name].update(passed=True, engine="cpu", throughput=[figure])
    data.update(selected=selected, selected_pair=selected, selected_engine="cpu", passed=True)
    (tmp_path / report_model.FILE).write_text(json.dumps(data))
    return tmp_path


def test_the_backup_is_the_fastest_other_passing_pair_than_the_one_served(tmp_path: Path) -> None:
    out = _output(tmp_path, {"int8": 300.0, "fp16": 200.0}, selected="int8")
    assert backup_of(out) == "fp16"  # serving the selected int8
    assert backup_of(out, "int8") == "fp16"
    assert backup_of(out, "fp16") == "int8"  # serving fp16: the faster int8 backs it
    assert backup_of(out, "baseline") == "int8"  # the baseline served: the fastest pair that passed
