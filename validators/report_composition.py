"""report.json's batch-composition record (validators/composition.py): how far a row's answer moves with the rows
batched beside it. Part of the report.json contract (validators/report_model.py imports them), kept apart for
the module size cap."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class _Model(BaseModel):
    """Every report object: no keys beyond the contract's."""

    model_config = ConfigDict(extra="forbid")


class CompositionFigure(_Model):
    """The probes' answers in one batch composition, against their answers alone and the baseline's."""

    name: Literal["alone", "random", "loudest"]
    detail: str
    cosine_to_alone_min: float = Field(description="the lowest per-probe cosine to the model's own answer alone")
    cosine_to_alone_median: float
    rel_l2_to_alone_max: float = Field(description="the largest per-probe ||in batch - alone|| / ||alone||")
    cosine_to_baseline: float = Field(description="the lowest whole-output cosine over the probes to the "
                                                  "baseline's answers alone (what the batched gates read)")
    row_cosine_to_baseline_min: float = Field(description="the lowest per-probe cosine to the baseline alone")


class BatchComposition(_Model):
    """Each probe row alone and inside batches of other rows, as the server's batcher can form them (padded to the
    longest on the padded inputs)."""

    batch_size: int = Field(ge=2, description="rows per composed batch: publish.serving.max_batch_size, at most "
                                              "the evaluation rows")
    probes: int = Field(ge=1)
    padded: list[str] = Field(description="inputs cut to each row's own length alone and padded to the longest "
                                          "in a batch (publish.serving.pad)")
    compositions: list[CompositionFigure]
    worst: str = Field(description="the composition with the lowest cosine to the baseline: the one gated "
                                   "(fidelity.batched.*)")
    dependent: bool = Field(description="a probe's answer in a batch moved from its answer alone by more than "
                                        "dependent_above (relative L2): the answer depends on the batch; runtime.json "
                                        "batch_dependent, and temper serve runs its requests one per batch")
    dependent_above: float
