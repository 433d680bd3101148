"""The recipe's data sources (`data.calibration`, `data.evaluation`): the part of the recipe this
package reads, owned here so calibration/ needs nothing of pipeline/."""

from __future__ import annotations

from pydantic import Field, PositiveInt, model_validator

from temper.artifacts.core.strict import CallableRef, Strict


class DataSource(Strict):
    """A calibration or evaluation set: a file/folder loaded with HF `datasets` or numpy, or a callable."""

    path: str | None = Field(None, description="csv, json, jsonl, parquet, npy, npz, or a datasets save_to_disk folder")
    callable: CallableRef | None = Field(
        None, description="file.py:function returning a dict of arrays or a datasets.Dataset")
    split: str | None = Field(None, description="split of a save_to_disk DatasetDict")
    columns: list[str] | None = Field(None, description="columns to keep (default: all)")
    label: str | None = Field(None, description="column holding the labels (kept apart from model inputs)")
    preprocess: CallableRef | None = Field(
        None, description="file.py:function(columns: dict[str, list|ndarray]) -> dict[input name, ndarray]"
    )
    samples: PositiveInt | None = Field(None, description="use this many samples (after a seeded shuffle)")
    seed: int = 0
    batch_size: PositiveInt = 32

    @model_validator(mode="after")
    def _one_source(self) -> DataSource:
        if (self.path is None) == (self.callable is None):
            raise ValueError("give exactly one of 'path' or 'callable'")
        return self
