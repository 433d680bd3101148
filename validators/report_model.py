"""report.json, the CI contract, as pydantic models: what `temper run` / `temper validate` write and
every reader (report.md, junit.xml, MLflow publishing, the benchmarks) reads through.

validators/report.schema.json is generated from these models (validators/report_schema.py), never
edited by hand:

    python -m temper.validators.report_schema > validators/report.schema.json

(tests/unit/test_report_schema.py fails when the shipped file differs from the models.) Field order
is the order report.json is written in. A change to what is written is a change to the contract:
bump SCHEMA_VERSION when a key is renamed or removed, or changes meaning.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

from temper.artifacts.core.host import HostProfile
from temper.artifacts.engines import Settings
from temper.artifacts.engines.onnxruntime import SessionSettings, needed_limit_mb
from temper.artifacts.engines.providers import Provider
from temper.validators.report_composition import BatchComposition, CompositionFigure
from temper.validators.report_tuning import Configuration, NodeSensitivity, SameGraph, Trial, Tuning

__all__ = ["BatchComposition", "CompositionFigure", "Configuration", "NodeSensitivity", "SameGraph", "Trial",
           "Tuning"]  # report.json's, kept apart for size

SCHEMA_VERSION = 6
FILE = "report.json"

Verdict = Literal["pass", "fail", "inconclusive"]
Interval = tuple[float, float]  # a confidence interval: (low, high)


class _Model(BaseModel):
    """Every report object: no keys beyond the contract's."""

    model_config = ConfigDict(extra="forbid")


class Gate(_Model):
    """One check of one candidate: what was measured, against what budget, and the verdict
    (validators.gates.Gate)."""

    name: str = Field(description='"build", "accuracy", "fidelity.<output>.cosine", "throughput.cpu.b32", ...')
    passed: bool
    measured: float | None
    budget: float | None
    detail: str
    verdict: Verdict = Field(description="inconclusive: a speed gate noise kept from deciding")
    interval: Interval | None = Field(description="a speed gate's confidence interval of the speedup")
    kind: Literal["build", "accuracy", "fidelity", "throughput", "precision", "fallback"] = Field(
        description="what the gate checks: tell gates apart by this, not by parsing name")
    provider: str | None = Field(None, description="a throughput gate's provider")
    batch_size: int | None = Field(None, description="a throughput gate's batch size")


class OutputSlice(_Model):
    """Where a sliced comparison cut its output: `start:stop` along `axis`."""

    output: str
    axis: int = Field(ge=0)
    start: int = Field(ge=0)
    stop: int = Field(ge=1)


class WorstRow(_Model):
    """The least faithful index of an output's leading non-batch axis (when it has at most
    validators.fidelity.MAX_ROWS): a detector's [batch, 4 + classes, anchors] compares each box row and each
    class row on its own, so the box pixels cannot hide broken class scores behind a whole-output cosine."""

    axis: int = Field(ge=1, description="the axis whose indices are compared one by one (samples first: 1)")
    rows: int = Field(ge=2, description="its size")
    index: int = Field(ge=0, description="the index whose cosine is the lowest")
    cosine: float = Field(description="that index's cosine to the baseline over every sample and position")
    spread: float = Field(ge=1, description="largest / smallest RMS of the baseline's rows (1: one scale)")


class Comparison(_Model):
    """One output (or one slice of an output) of a candidate against the baseline's, as
    validators.fidelity.compare measures it."""

    name: str = Field(description="the output's name, or the slice's (validate.fidelity.slices[].name)")
    slice: OutputSlice | None = Field(description="the part of the output compared (null: the whole output)")
    max_abs: float
    mean_abs: float
    p99_abs: float
    max_rel: float
    rel_l2: float = Field(description="||candidate - baseline|| / ||baseline|| (L2 over every value)")
    cosine: float
    nonfinite: int = Field(ge=0, description="NaN/Inf values in the candidate's output")
    within_tolerance: bool = Field(description="numpy.allclose at atol = rtol = 0, and every value finite")
    worst_row: WorstRow | None = Field(None, description="a whole output's least faithful row (null: a slice, or no "
                                                         "small leading non-batch axis)")

    def describe(self) -> str:
        return (f"{self.name}: max abs err {self.max_abs:.3g}, mean {self.mean_abs:.3g}, "
                f"max rel {self.max_rel:.3g}, rel L2 {self.rel_l2:.3g}, cosine {self.cosine:.6f}, "
                f"non-finite {self.nonfinite}")


class Latency(_Model):
    """Percentiles of one inference call, in milliseconds."""

    p50: float = Field(ge=0)
    p90: float = Field(ge=0)
    p95: float = Field(ge=0)
    p99: float = Field(ge=0)


class Load(_Model):
    """What else ran while a batch size was measured (artifacts.core.host.Load)."""

    load_1m: float | None
    steal_pct: float | None
    busy_pct: float | None


class Measurement(_Model):
    """Throughput of one model at one batch size on one engine (validators.throughput.Measurement):
    the median of its interleaved slices."""

    provider: Provider = Field(description="the engine: a row of artifacts/engines/providers.py")
    batch_size: int = Field(ge=1)
    runs: int = Field(ge=1, description="timed inference calls")
    samples: int = Field(ge=1, description="runs * batch_size")
    seconds: float = Field(gt=0, description="timed wall time")
    samples_per_s: float = Field(gt=0)
    latency_ms: Latency
    peak_rss_mb: float = Field(gt=0, description="the whole process's resident set size, highest value sampled")
    gpu_mem_mb: float | None = None
    rounds: int = Field(ge=1, description="interleaved slices this figure is the median of")
    spread_pct: float | None = Field(ge=0, description="(fastest - slowest slice) / median, in %")
    load: Load | None
    session: Settings | None = Field(
        description="the engine settings this figure was measured with, read back from the session or compiled "
                    "model: ONNX Runtime's (threads chosen per model as serving chooses them) or OpenVINO's "
                    "(inference precision, threads, streams, performance hint); a published bundle's runtime.json "
                    "records the selected pair's")
    threads: int | None = Field(None, description="the CPU threads one call ran on, read back from the session: "
                                                  "without session_search every pair of a run is timed on one count, "
                                                  "the one serving chooses for the baseline on the first engine")


class CandidateMeasurement(Measurement):
    """A pair's measurement, with its speedup over the reference's (the baseline on the first engine) at the
    same batch size."""

    speedup: float = Field(gt=0, description="geometric mean of the paired per-round ratios")
    speedup_interval: Interval | None = Field(description="its confidence interval (null below two rounds)")


class OpCount(_Model):
    quantized: int = Field(ge=0)
    fp16: int = Field(ge=0)
    fp32: int = Field(ge=0)


class Census(_Model):
    """What a candidate's graph computes in (validators/census.py): its eligible compute nodes (Conv,
    ConvTranspose, MatMul, Gemm, Attention, LSTM), subgraphs included, by how they compute."""

    eligible: int = Field(ge=0, description="compute nodes INT8 quantizers target")
    quantized: int = Field(ge=0, description="QLinear*/*Integer ops, or float ops reading DequantizeLinear outputs")
    fp16: int = Field(ge=0, description="float ops computing in float16")
    fp32: int = Field(ge=0, description="float ops left in float32")
    in_subgraphs: int = Field(ge=0, description="of the eligible, those inside If/Loop/Scan bodies")
    quantized_in_subgraphs: int = Field(ge=0)
    dynamic: int = Field(ge=0, description="of the quantized, those quantizing activations at run time")
    by_op: dict[str, OpCount] = Field(description="by the eligible op type each node is or stands for")


class Candidate(_Model):
    """Everything decided about one (model, engine) pair: keyed by the model's name on the first engine
    listed, model@engine on another (validators/pairs.py)."""

    model: str = Field(description="the built model: the baseline or a candidate of the recipe")
    engine: Provider = Field(description="the engine it was gated on and would serve on")
    engine_precision: str | None = Field(
        description="what the engine computes float ops in, read back from it (OpenVINO's INFERENCE_PRECISION_HINT: "
                    "f32, bf16); null: the graph's own (ONNX Runtime)")
    passed: bool = Field(description="every gate passed")
    precision: str | None = Field(description="what the graph is, from its census: fp32, fp16, int8-static or "
                                              "int8-dynamic (null: it did not build)")
    intended_precision: str | None = Field(description="what the recipe's steps asked for; a built graph that is "
                                                       "something else fails the precision gate")
    census: Census | None = Field(description="the graph's compute nodes by precision (null: it did not build)")
    engine_census: Census | None = Field(
        description="what ONNX Runtime's CPU provider runs of a quantized graph: the census of the graph it "
                          "optimizes the model into (validators/engine_census.py), where Q/DQ left around a float op "
                          "means float compute; null: not an ONNX Runtime CPU pair, or nothing quantized")
    bytes: int | None = Field(ge=0, description="the model file's size (null: it did not build)")
    metric: float | None
    drop: float | None
    gates: list[Gate] = Field(min_length=1)
    fidelity: list[Comparison]
    throughput: list[CandidateMeasurement]
    tuning: Tuning | None
    batch_composition: BatchComposition | None = Field(
        None, description="its answers inside batches of other rows (null: not measured, a fixed batch dim)")


class Baseline(_Model):
    """The reference every pair is measured against: the FP32 baseline on the first engine listed."""

    metric: float | None
    engine: Provider
    throughput: list[Measurement]
    batch_composition: BatchComposition | None = Field(
        None, description="the baseline's answers inside batches of other rows (null: not measured)")


class Target(_Model):
    """What quantize's preset auto resolved to, and why."""

    target: str
    preset: str | None
    reason: str


class SpeedPolicy(_Model):
    """How speed gates decide."""

    min_speedup: float | None
    gated_batch_sizes: list[Annotated[int, Field(ge=1)]]
    confidence: float = Field(gt=0, lt=1)
    max_duration_s: float = Field(gt=0)
    inconclusive: Literal["fail", "pass"]


class Search(_Model):
    """A candidate whose options listed alternatives: the combinations built, and how many there were."""

    trials: list[str]
    combinations: int = Field(ge=1)


class SettingSpeedup(_Model):
    """A setting's speedup over the default settings at one batch size (paired rounds, as the speed gates)."""

    batch_size: int = Field(ge=1)
    speedup: float = Field(gt=0, description="geometric mean of the paired per-round ratios")
    interval: Interval | None = Field(description="its confidence interval (null below two rounds)")
    rounds: int = Field(ge=1)


class SettingTrial(_Model):
    """One row of the session settings table, timed against the default."""

    name: str = Field(description='the row: "one-thread", "spinning", "extended", ...')
    changes: dict[str, Any] = Field(description="what it changes in the default settings")
    settings: dict[str, Any] = Field(description="the whole settings it ran with")
    verdict: Literal["kept", "faster", "not faster", "slower", "rejected"] = Field(
        description="kept: the fastest of the faster; faster: interval above 1.0 at the ranking batch size and "
                    "below 1.0 at none; slower: interval below 1.0 at some batch size; not faster: neither; "
                    "rejected: its outputs differed from the plain run's (a CUDA graph replay), so it was not timed")
    speedups: list[SettingSpeedup]
    problem: str | None = Field(None, description="rejected: where its outputs differed, one line")

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """`problem` only on a rejected row: the other rows' records stay as they were."""
        data: dict[str, Any] = handler(self)
        if self.problem is None:
            data.pop("problem", None)
        return data


class SessionSearch(_Model):
    """validate.throughput.session_search for one model on one provider (validators/session_search.py): the
    settings it was then gated with, and would serve with, and the evidence."""

    provider: Provider
    default: dict[str, Any] = Field(description="the settings every row was compared with")
    kept: str = Field(description='"default", or the row whose settings were kept')
    settings: dict[str, Any] = Field(description="the kept settings: what the model's figures were measured with")
    ranking_batch_size: int = Field(ge=1, description="where a row must be faster on its interval to be kept")
    confidence: float = Field(gt=0, lt=1)
    budget_s: float = Field(gt=0, description="validate.throughput.session_search_s: the search's wall time at most, "
                                                 "building its sessions included (one round at each batch size always "
                                                 "runs)")
    seconds: float = Field(ge=0, description="the search's wall time when it ran (a cached one: the original's)")
    cut_short: list[int] = Field(default_factory=list,
                                 description="batch sizes where the budget stopped the rounds before the rule did "
                                             "(undecided rows keep the default)")
    enough_s: float | None = Field(None, ge=0, description="with cut_short: about the budget that would give every "
                                                           "setting 5 rounds at each batch size")
    cached: bool = Field(description="reused from an earlier run's search of the same model on this host")
    load: Load | None = Field(description="what else ran during the search's last batch size")
    trials: list[SettingTrial]


class NotBuilt(_Model):
    """A candidate that did not build, and why (its `build` gate failed with the same reason)."""

    kind: Literal["error", "rejected"] = Field(
        description="error: something raised while building (a library, temper, the environment): the run exits 1 "
                    "unless --allow-build-errors; rejected: a step's own check refused the model it built "
                    "(NaN/Inf, a mismatch), a verdict like a gate's")
    reason: str = Field(description="one line")


class EngineDisagreement(_Model):
    """One model file whose outputs on two engines miss the recipe's fidelity budget against each other
    (validators/engine_agreement.py): the engine, not the model, decides what it computes."""

    model: str = Field(description="the model (the baseline or a candidate): one file")
    engine: Provider = Field(description="the first engine it was evaluated on: the reference of the comparison")
    other: Provider
    missed: list[str] = Field(min_length=1, description="each fidelity bound the other engine's outputs miss "
                                                        "against the first engine's, as a gate detail")
    comparisons: list[Comparison] = Field(description="the other engine's outputs against the first engine's")


class TiedPair(_Model):
    """A pair that passed every gate and beat the baseline, but could not be told from the selected pair on
    the selection's own measure: their paired interval holds 1.0 (or speed was not measured)."""

    pair: str = Field(description="its key in candidates")
    speedup: float | None = Field(description="the selected pair's speed over this one's (paired rounds at the "
                                              "ranking batch size; null: not measured)")
    speedup_interval: Interval | None
    fidelity: float | None = Field(description="its lowest cosine to the baseline (outputs, worst rows, slices)")


class Report(_Model):
    """The machine-readable verdict of `temper run` / `temper validate`: the contract CI jobs read."""

    model_config = ConfigDict(title="temper report.json")

    schema_version: Literal[6]
    recipe: str
    host: HostProfile = Field(description="the machine every figure was measured on")
    target: Target | None = Field(description="what quantize's preset auto resolved to, and why")
    metric: str | None
    baseline: Baseline
    allowed_drop: float | None = Field(ge=0)
    speed_policy: SpeedPolicy | None = Field(description="how speed gates decide (null without validate.throughput)")
    candidates: dict[str, Candidate]
    not_built: dict[str, NotBuilt] = Field(
        default_factory=dict, description="the candidates that did not build, and why (also their build gates)")
    searches: dict[str, Search] = Field(
        description="candidates whose options listed alternatives: the combinations built")
    session_searches: dict[str, list[SessionSearch]] = Field(
        default_factory=dict, description="validate.throughput.session_search: per model (baseline or candidate), "
                                          "one search per provider that has settings to try")
    select: Literal["fastest-passing", "smallest-passing"]
    selected: str = Field(description="the selected model (a candidate, or baseline): its folder and what the "
                                      "serving bundle ships")
    selected_engine: Provider = Field(description="the engine the selected model was gated on and serves on")
    selected_pair: str = Field(description="the selected pair's key in candidates (baseline: the reference)")
    selection_reason: str = Field(description="why the selected pair was selected: a candidate's evidence over the "
                                              "baseline and the pairs it tied with; for the baseline, why no "
                                              "candidate passed every gate, or why none that did beat it")
    ties: list[TiedPair] = Field(default_factory=list, description="pairs tied with the selected one on speed "
                                                                  "(smallest-passing: on size, then speed); the "
                                                                  "selected one won on fidelity, then size")
    engine_disagreements: list[EngineDisagreement] = Field(
        default_factory=list, description="model files whose outputs on two engines miss the fidelity budget "
                                          "against each other")
    passed: bool = Field(description="a candidate was selected: it passed every gate and beat the baseline "
                                     "(false: the baseline is selected, selection_reason says why)")

    def session_of(self, pair: str) -> Settings | None:
        """The engine settings `pair` (a candidates key, or baseline: the reference) was measured with: what
        its serving bundle records, a GPU pair's CUDA arena bounded by what its gates saw it hold
        (needed_limit_mb). None when nothing was measured."""
        figures = self.baseline.throughput if pair == "baseline" else self.candidates[pair].throughput
        if not figures:
            return None
        settings, peaks = figures[0].session, [f.gpu_mem_mb for f in figures if f.gpu_mem_mb]
        if isinstance(settings, SessionSettings) and peaks and settings.gpu_mem_limit_mb is None:
            # a GPU pair serves within what its gates saw it need, not the whole device
            return settings.model_copy(update={"gpu_mem_limit_mb": needed_limit_mb(max(peaks))})
        return settings


def batch_dependent(report: Report, pair: str) -> bool:
    """Whether `pair`'s (a candidates key, or baseline) answers depend on the rows batched with it."""
    found = report.baseline.batch_composition if pair == "baseline" else report.candidates[pair].batch_composition
    return bool(found and found.dependent)


def dumps(report: Report) -> str:
    """report.json's text: two-space indents, keys in the models' order, NaN as json.dumps writes it."""
    return json.dumps(report.model_dump(), indent=2) + "\n"


def load(path: Path) -> Report:
    """A report.json as written by `dumps`; pydantic.ValidationError when it is not one."""
    return Report.model_validate(json.loads(path.read_text()))
