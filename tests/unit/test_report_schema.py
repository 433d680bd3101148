"""validators/report.schema.json is generated from validators/report_model.py, and both describe the
same report.json: what the models write is what the schema accepts, key for key."""

from __future__ import annotations

import copy
import json

import jsonschema
import pytest
from pydantic import ValidationError

from temper.validators.report_model import Report, dumps
from temper.validators.report_schema import report_schema, schema_text
from tests.unit.reports import SCHEMA, SCHEMA_FILE, sample_report


def test_the_shipped_schema_is_the_generated_one():
    assert SCHEMA_FILE.read_text() == schema_text(), (
        "validators/report.schema.json is stale: "
        "python -m temper.validators.report_schema > validators/report.schema.json")


def test_the_schema_is_a_valid_draft_2020_12_schema():
    jsonschema.Draft202012Validator.check_schema(report_schema())


def test_the_sample_report_reads_back_and_writes_the_same_keys_and_values():
    sample = sample_report()
    report = Report.model_validate(sample)
    written = json.loads(dumps(report))
    assert written == sample
    jsonschema.validate(written, SCHEMA)


def test_a_report_written_from_the_model_keeps_value_types():
    written = json.loads(dumps(Report.model_validate(sample_report())))
    int8 = written["candidates"]["int8"]
    assert isinstance(int8["bytes"], int) and isinstance(int8["throughput"][0]["batch_size"], int)
    assert (isinstance(int8["gates"][1]["interval"], list)
            and isinstance(int8["throughput"][0]["speedup_interval"], list))
    assert isinstance(written["host"]["usable_cores"], int) and isinstance(written["baseline"]["metric"], float)


@pytest.mark.parametrize("edit", [
    lambda r: r.pop("selected"),
    lambda r: r.update(schema_version=1),
    lambda r: r.update(select="best"),
    lambda r: r.update(extra_key=1),
    lambda r: r["candidates"]["int8"]["gates"][1].update(verdict="maybe"),
    lambda r: r["candidates"]["int8"].update(gates=[]),
    lambda r: r["candidates"]["int8"]["throughput"][0].update(provider="tpu"),
    lambda r: r["candidates"]["int8"]["throughput"][0].pop("speedup"),
    lambda r: r["baseline"]["throughput"][0]["latency_ms"].pop("p99"),
    lambda r: r["host"].update(cpu=None),
    lambda r: r["speed_policy"].update(inconclusive="retry"),
], ids=["missing key", "schema version", "select rule", "unknown key", "gate verdict", "no gates", "provider",
        "candidate speedup", "latency percentile", "host cpu", "inconclusive policy"])
def test_the_model_and_the_schema_refuse_the_same_bad_reports(edit):
    report = copy.deepcopy(sample_report())
    edit(report)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(report, SCHEMA)
    with pytest.raises(ValidationError):
        Report.model_validate(report)
