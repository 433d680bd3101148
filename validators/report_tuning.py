"""report.json's record of the quantize fallback (tuning.json): its trials, configurations and SQNR ranking.
Part of the report.json contract (validators/report_model.py imports them), kept apart for the module size cap."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Model(BaseModel):
    """Every report object: no keys beyond the contract's."""

    model_config = ConfigDict(extra="forbid")


class Trial(_Model):
    """One model the quantize fallback built and scored."""

    kind: Literal["plain", "configuration", "refine", "cumulative"] = Field(
        description="configuration: another configuration's plain model that met the budget alone")
    float_nodes: list[str]
    metric: float
    drop: float
    cosine: float
    samples_per_s: float | None
    passed: bool = Field(description="the accuracy budget and every fidelity gate hold")
    quantized: int = Field(ge=0, description="quantized compute nodes left in the trial's graph (the census)")
    configuration: dict[str, Any] = Field(description="options changed from the step's ({}: the step's own)")


class Configuration(_Model):
    """One configuration the fallback tried before any node went float: its plain model's score."""

    changes: dict[str, Any] = Field(description="options changed from the step's, e.g. {per_channel: true}")
    metric: float | None = Field(None, description="None when it did not calibrate (see error)")
    drop: float | None = None
    cosine: float | None = None
    quantized: int | None = Field(None, ge=0)
    passed: bool
    error: str | None = Field(None, description="why it was skipped: its calibration failed")


class NodeSensitivity(_Model):
    """One quantized node's SQNR (pipeline.steps.quantize.sensitivity.NodeSensitivity)."""

    node: str
    op_type: str
    block: str
    sqnr_db: float
    accumulated_db: float | None


class SameGraph(_Model):
    """A node set the fallback put in float that wrote an earlier trial's graph byte for byte."""

    float_nodes: list[str]
    trial: int = Field(ge=0, description="index of the trial whose graph it wrote")


class Tuning(_Model):
    """The quantize fallback (tuning.json): every trial, and the SQNR ranking (most harmful first)."""

    metric: str
    baseline_metric: float
    allowed_drop: float
    met: bool
    best: int = Field(ge=0, description="index of the kept trial")
    max_trials: int = Field(ge=1)
    min_quantized: float = Field(gt=0, le=1, description="fallback.min_quantized: the floor as a fraction of the "
                                                          "plain trial's quantized nodes")
    floor: int = Field(ge=0, description="quantized nodes every trial kept at least; fewer were never scored")
    floor_reached: bool = Field(description="a trial was refused for going below the floor: meeting the budget "
                                            "would take more float nodes than INT8 allows")
    configuration: dict[str, Any] = Field(description="the configuration the node search started from ({}: the "
                                                      "step's own)")
    configurations: list[Configuration] = Field(description="configurations tried before any node went float")
    trials: list[Trial] = Field(min_length=1)
    same_graph: list[SameGraph] = Field(default_factory=list,
                                        description="node sets that wrote a trial's graph again: that trial, not a "
                                                    "new one (max_trials counts distinct models)")
    ranking: list[NodeSensitivity]

    @property
    def counted(self) -> int:
        """Trials max_trials counts: a configuration round's model met the budget alone and stands beside them."""
        return sum(t.kind != "configuration" for t in self.trials)

    def trials_text(self, most: bool = True) -> str:
        """`12 of at most 12 trials and 2 configuration rounds`: what max_trials counted (out of how many, with
        `most`), and the rounds it does not count."""
        rounds = len(self.configurations)
        total = self.max_trials if most else self.counted
        return (f"{self.counted}{f' of at most {self.max_trials}' if most else ''} trial{'s' if total > 1 else ''}"
                + (f" and {rounds} configuration round{'s' if rounds > 1 else ''}" if rounds else ""))

    def stopped(self) -> str:
        """Why a search that missed its budget ended, and what would take it further."""
        if self.floor_reached:
            return (f"it reached the floor of {self.floor} quantized node{'s' if self.floor != 1 else ''} "
                    f"(fallback.min_quantized "
                    f"{self.min_quantized:g} of the plain model's): more nodes in float would no longer be INT8, so "
                    "the budget is not reachable in INT8 beyond it; lower fallback.min_quantized or raise the budget")
        if self.counted >= self.max_trials:
            return "it spent fallback.max_trials; raise fallback.max_trials or the budget"
        return "every ranked node was tried in float; raise the budget"
