"""What validation reads and what it decides: the Subject (a recipe's gates, data and built models), one
CandidateResult per (model, engine) pair, and the Validation that selects among them.

Kept apart from validation.py (which runs the gates) and pair_gates.py (the gates themselves) so that both,
and the pipeline that assembles a Subject, share these records without importing each other."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from temper.artifacts.core.host import HostProfile
from temper.artifacts.core.layout import AXIS0, Layout
from temper.artifacts.engines.providers import Provider
from temper.calibration.sources import Dataset
from temper.validators import report_model
from temper.validators.census import Census
from temper.validators.evaluate import Kept
from temper.validators.gates import Selection, Verdict
from temper.validators.pairs import BASELINE, Pair
from temper.validators.session_search import Records
from temper.validators.spec import ValidateSpec
from temper.validators.speedup import Speedup
from temper.validators.throughput import Measurement


class Searched(Protocol):
    """A searched candidate (pipeline.search.Search): the combinations built, and how many there were."""

    @property
    def trials(self) -> list[str]: ...

    @property
    def combinations(self) -> int: ...


@dataclass(frozen=True)
class Subject:
    """What is validated: the recipe's gates, its data, and the models the run produced."""

    recipe_name: str
    recipe_file: str
    base: Path
    spec: ValidateSpec
    rule: str
    evaluation: Dataset
    eval_batch_size: int
    calibration: Dataset | None
    outputs: list[str]
    baseline: Path
    candidates: dict[str, Path | str]  # the built model, or the reason its build failed
    searches: Mapping[str, Searched] = field(default_factory=dict)  # searched candidate -> its trials
    precisions: dict[str, str] = field(default_factory=dict)  # candidate -> fp16, int8-static, ...
    preset: dict[str, str | None] | None = None  # what quantize's preset auto resolved to: target, preset, reason
    tunings: dict[str, dict[str, Any]] = field(default_factory=dict)  # candidate -> its quantize fallback record
    layout: Layout = AXIS0  # batch axes and constants every batch is formed with
    records: Records | None = None  # where session settings searches are kept between runs (the pipeline's cache)
    kept: Kept | None = None  # where models' outputs over the data are kept between runs (the pipeline's cache)
    serving_pad: dict[str, int | float] = field(default_factory=dict)  # publish.serving: how the batcher pads
    serving_batch: int = 16  # publish.serving.max_batch_size: the batches the composition gates form
    providers_active: bool = False  # the pre-flight opened the baseline on every provider (pipeline/preflight.py)


@dataclass
class CandidateResult:
    verdict: Verdict  # named by the pair's key: the model's name on the reference engine, else model@engine
    pair: Pair
    metric: float | None = None
    drop: float | None = None
    fidelity: list[report_model.Comparison] = field(default_factory=list)
    throughput: list[tuple[Measurement, Speedup]] = field(default_factory=list)  # with its speedup interval
    tuning: dict[str, Any] | None = None  # the quantize fallback's record (tuning.json), when it ran
    census: Census | None = None  # what the built graph computes in (None: it did not build)
    engine_precision: str | None = None  # what the engine computes float ops in, read back (OpenVINO); None: graph
    engine_census: Census | None = None  # what ONNX Runtime's CPU provider runs of a quantized graph (engine_census)
    composition: report_model.BatchComposition | None = None  # its answers inside batches of other rows


@dataclass
class Validation:
    subject: Subject
    host: HostProfile  # where every figure was measured
    metric_name: str | None
    baseline_metric: float | None
    allowed_drop: float | None
    baseline_throughput: list[Measurement]  # the reference pair's: the baseline on the first engine
    candidates: list[CandidateResult]  # every other pair
    selected: str  # a pair's key, or "baseline" when none passed or none that passed beat the reference
    reason: str  # why that pair was selected
    session_searches: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # model -> one per provider
    selection: Selection = field(default_factory=lambda: Selection(None))  # with the pairs tied with the selected
    disagreements: list[report_model.EngineDisagreement] = field(default_factory=list)  # one file, two engines
    baseline_composition: report_model.BatchComposition | None = None

    @property
    def passed(self) -> bool:
        """A candidate was selected: it passed every gate and beat the baseline (gates.select)."""
        return self.selected != BASELINE


def providers_of(spec: ValidateSpec) -> list[Provider]:
    """The providers a recipe pairs its models with: validate.throughput.providers, else ONNX Runtime's CPU."""
    return list(spec.throughput.providers) if spec.throughput else ["cpu"]
