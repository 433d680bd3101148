"""The base of every recipe section's model, and the two string types several sections share.

It sits in the bottom layer because each layer owns the models of its part of the recipe
(calibration its data sources, validators its gates, pipeline its steps and the whole recipe).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, StringConstraints

Identifier = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_.:/-]*$")]
# "path/to/file.py:function", resolved relative to the recipe's folder.
CallableRef = Annotated[str, StringConstraints(pattern=r"^.+\.py:[A-Za-z_][A-Za-z0-9_]*$")]


class Strict(BaseModel):
    """Unknown keys are errors, and so are values of the wrong type: YAML's `batch_size: true` or
    `per_channel: "no"` must not quietly become 1 or True."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, strict=True)
