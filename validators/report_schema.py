"""report.json's JSON Schema (validators/report.schema.json), generated from validators/report_model.py:

    python -m temper.validators.report_schema > validators/report.schema.json

CI jobs and other readers validate report.json against the shipped file without importing temper.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic.json_schema import GenerateJsonSchema

from temper.validators.report_model import Report


class _NoFieldTitles(GenerateJsonSchema):
    """Leave out the "title" pydantic derives from every field's name: it repeats the key."""

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False


def report_schema() -> dict[str, Any]:
    """The JSON Schema of report.json (draft 2020-12)."""
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            **Report.model_json_schema(schema_generator=_NoFieldTitles)}


def schema_text() -> str:
    """validators/report.schema.json's text."""
    return json.dumps(report_schema(), indent=2) + "\n"


if __name__ == "__main__":
    print(schema_text(), end="")
