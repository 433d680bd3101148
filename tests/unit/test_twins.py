"""Types that exist twice on purpose must agree field by field.

Each pair has a reason to be two types: the measuring side is a light dataclass built in hot or
low-level code (artifacts/ may import nothing of temper; the timing loop builds thousands), while
report.json's side is the pydantic contract with descriptions and bounds. Nothing but this test
keeps them from drifting apart: a field added to one and not the other fails here.
"""

from __future__ import annotations

import dataclasses

import pytest
from pydantic import BaseModel

from temper.artifacts.core.host import Load
from temper.artifacts.formats.bundle import ServingConfig
from temper.pipeline.recipe import ServingOptions
from temper.pipeline.steps.quantize.fallback import Trial
from temper.pipeline.steps.quantize.sensitivity import NodeSensitivity
from temper.validators import gates, report_model, throughput


def _fields(kind: type) -> set[str]:
    if dataclasses.is_dataclass(kind):
        return {f.name for f in dataclasses.fields(kind)}
    assert issubclass(kind, BaseModel), kind
    return set(kind.model_fields)


@pytest.mark.parametrize(("measured", "reported"), [
    (gates.Gate, report_model.Gate),
    (throughput.Measurement, report_model.Measurement),
    (Trial, report_model.Trial),
    (NodeSensitivity, report_model.NodeSensitivity),
    (Load, report_model.Load),
], ids=lambda kind: f"{kind.__module__.rsplit('.', 1)[-1]}.{kind.__name__}")
def test_each_measured_type_has_exactly_the_fields_report_json_holds(measured: type, reported: type) -> None:
    assert _fields(measured) == _fields(reported)


def test_the_recipe_serving_options_are_the_bundle_config_s_batching_fields() -> None:
    """publish.serving in a recipe becomes runtime.json: every option must land in a ServingConfig field of
    the same name, type and default."""
    config = ServingConfig.model_fields
    for name, field in ServingOptions.model_fields.items():
        assert name in config, name
        assert field.annotation == config[name].annotation, name
        assert field.get_default(call_default_factory=True) == config[name].get_default(call_default_factory=True), name
