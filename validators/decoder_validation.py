"""Gate a decoder's candidates against its FP32 baseline and select one for the workload: the decoder recipe's
report.json. Quality first, one candidate's session open at a time; then every candidate that held its gates is
timed beside the baseline in the same interleaved rounds."""

from __future__ import annotations

import gc
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from temper.artifacts.core.host import profile
from temper.artifacts.engines.decoder_session import DecoderSession, Generated
from temper.validators import decode_speed
from temper.validators.decoder_census import weight_census, weight_share
from temper.validators.decoder_report import (
    SCHEMA_VERSION,
    DecoderGate,
    DecoderModel,
    DecoderReport,
    Generation,
    Quality,
    Speed,
    SpeedSetup,
)
from temper.validators.decoder_selection import meets, select
from temper.validators.decoder_spec import DecoderValidate, QualitySpec, WorkloadSelect
from temper.validators.export_check import check
from temper.validators.perplexity import compare, sequence_nll

DECODE_PATH = ("ONNX Runtime CPU, KV cache on: the prompt in one prefill call, then one token per call with the "
               "previous call's present tensors as past (numpy feeds, no IO binding)")


@dataclass(frozen=True)
class Built:
    """A candidate to gate: its folder, its weight options and the precision its weights must be stored in."""

    folder: Path
    weights: dict[str, Any]
    expected: str  # "4-bit" or "8-bit"
    kept_float: int = 0  # weight matrices the recipe keeps in float (weights.keep_float)
    backup: str | None = None  # the precision a mixed-precision quantizer (NNCF) may store the others in


def _size_mb(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.iterdir() if p.name.endswith((".onnx", ".onnx.data", ".data"))) / 1e6


def _generate(session: DecoderSession, prompts: Sequence[Sequence[int]], spec: QualitySpec) -> list[Generated]:
    return [session.generate(p, spec.generation_tokens, loop_window=spec.loop_window, loop_repeats=spec.loop_repeats)
            for p in prompts]


def _gates(built: Built, census: dict[str, int], quality: Any, generated: list[Generated],
           reference: list[Generated], spec: QualitySpec) -> list[DecoderGate]:
    total = sum(census.values())
    share = weight_share(census, built.expected)
    stored = census.get(built.expected, 0) + (census.get(built.backup, 0) if built.backup else 0)
    exact = (stored == total - built.kept_float and census.get("float", 0) == built.kept_float
             and (built.backup is None or census.get(built.expected, 0) > 0))
    kept = f" but the {built.kept_float} keep_float names" if built.kept_float else ""
    asked = f"{built.expected} or {built.backup} (NNCF's backup), some {built.expected}" if built.backup else \
        built.expected
    delta = quality.delta
    upper = delta.high if delta.high is not None else delta.mean
    interval = (delta.low, delta.high) if delta.low is not None and delta.high is not None else None
    loops = [i for i, (g, r) in enumerate(zip(generated, reference)) if g.stopped == "loop" and r.stopped != "loop"]
    return [
        DecoderGate(name="precision", kind="precision", passed=exact, measured=share,
                    budget=(total - built.kept_float) / total if total else 1.0, interval=None,
                    detail=f"{census}: every weight matrix{kept} must be {asked}"),
        DecoderGate(name="nll_delta", kind="quality", passed=upper <= spec.nll_delta_max, measured=delta.mean,
                    budget=spec.nll_delta_max, interval=interval,
                    detail=f"perplexity {quality.candidate_perplexity:.3f} vs {quality.baseline_perplexity:.3f}; "
                           f"upper end of the {spec.confidence:.0%} paired interval over {delta.pairs} sequences "
                           f"{upper:+.4f} nats/token"),
        DecoderGate(name="agreement", kind="quality", passed=quality.agreement >= spec.agreement_min,
                    measured=quality.agreement, budget=spec.agreement_min, interval=None,
                    detail=f"next-token argmax equal to the baseline's on {quality.tokens} tokens"),
        DecoderGate(name="kl", kind="quality", passed=quality.kl <= spec.kl_max, measured=quality.kl,
                    budget=spec.kl_max, interval=None, detail="mean KL(baseline || candidate) per token, nats"),
        DecoderGate(name="generation", kind="generation", passed=not loops, measured=float(len(loops)), budget=0.0,
                    interval=None, detail=(f"greedy decoding looped on prompt(s) {loops} where the baseline did not"
                                           if loops else "every prompt reached an end-of-sequence token or the length "
                                           "limit without a loop the baseline does not have")),
    ]


def _speed(figures: decode_speed.DecodeSpeed, rounds: int) -> Speed:
    def interval(s: Any) -> tuple[float, float] | None:
        return (s.low, s.high) if s is not None and s.low is not None and s.high is not None else None

    return Speed(ttft_ms=figures.ttft_ms, decode_tokens_per_s=figures.decode_tokens_per_s,
                 ttft_speedup=figures.ttft_speedup.ratio if figures.ttft_speedup else None,
                 ttft_speedup_interval=interval(figures.ttft_speedup),
                 decode_speedup=figures.decode_speedup.ratio if figures.decode_speedup else None,
                 decode_speedup_interval=interval(figures.decode_speedup), rounds=rounds)


def validate(recipe: str, baseline: Path, built: dict[str, Built], sequences: Sequence[Sequence[int]],
             prompts: Sequence[Sequence[int]], spec: DecoderValidate, workload: WorkloadSelect, *,
             not_built: dict[str, str] | None = None, searches: dict[str, list[str]] | None = None,
             source_view: dict[str, list] | None = None,
             progress: Callable[[str], None] = lambda _: None) -> DecoderReport:
    """`source_view`: the source framework's per-sequence NLL and argmax (pipeline/decoders/source_logits.py) on
    `sequences`, which the baseline is gated against when the recipe asks (validate.export)."""
    q, s = spec.quality, spec.speed
    base = DecoderSession(baseline, threads=s.threads)
    export = (check("transformers", source_view, sequences, base.logits, spec.export, q.confidence)
              if source_view is not None and spec.export is not None else None)
    reference = _generate(base, prompts, q)
    models: dict[str, DecoderModel] = {}
    for name, item in built.items():
        progress(f"{name}: quality gates")
        session = DecoderSession(item.folder, threads=s.threads)
        quality = compare(sequences, base.logits, session.logits, q.confidence)
        generated = _generate(session, prompts, q)
        census = weight_census(item.folder / session.layout.filename)
        gates = _gates(item, census, quality, generated, reference, q)
        delta = quality.delta
        models[name] = DecoderModel(
            weights=item.weights, census=census, size_mb=_size_mb(item.folder),
            quality=Quality(perplexity=quality.candidate_perplexity, nll_delta=delta.mean,
                            nll_delta_interval=(delta.low, delta.high) if delta.low is not None
                            and delta.high is not None else None, agreement=quality.agreement, kl=quality.kl,
                            sequences=len(sequences), tokens=quality.tokens),
            generation=Generation(stopped=[g.stopped for g in generated],
                                  tokens=[len(g.tokens) for g in generated]),
            speed=None, gates=gates, passed=all(g.passed for g in gates), meets_workload=False)
        del session
        gc.collect()
    base_nll = [sequence_nll(base.logits(ids), ids)[0] for ids in sequences]
    timed = {name: DecoderSession(built[name].folder, threads=s.threads) for name, m in models.items() if m.passed}
    progress(f"speed: baseline and {len(timed)} candidate(s), {s.rounds} rounds")
    figures = decode_speed.measure({"baseline": base, **timed}, "baseline", prompt_length=s.prompt_length,
                                   decode_tokens=s.decode_tokens, batch_size=s.batch_size, rounds=s.rounds,
                                   confidence=s.confidence)
    for name in timed:
        speed = _speed(figures[name], s.rounds)
        models[name] = models[name].model_copy(update={"speed": speed, "meets_workload": meets(
            speed, workload.ttft_ms_max, workload.decode_tokens_per_s_min)})
    base_speed = _speed(figures["baseline"], s.rounds)
    base_model = DecoderModel(
        weights={}, census=weight_census(baseline / base.layout.filename), size_mb=_size_mb(baseline),
        quality=None, generation=Generation(stopped=[g.stopped for g in reference],
                                            tokens=[len(g.tokens) for g in reference]),
        speed=base_speed, gates=export.gates if export else [], passed=export.passed if export else True,
        meets_workload=meets(base_speed, workload.ttft_ms_max, workload.decode_tokens_per_s_min))
    selected, reason = select(models, base_model, workload.workload, workload.ttft_ms_max,
                              workload.decode_tokens_per_s_min)
    return DecoderReport(
        schema_version=SCHEMA_VERSION, kind="decoder", recipe=recipe, host=profile(), baseline=base_model,
        baseline_perplexity=math.exp(sum(base_nll) / len(base_nll)), export=export,
        speed_setup=SpeedSetup(prompt_length=s.prompt_length, decode_tokens=s.decode_tokens,
                               batch_size=s.batch_size, rounds=s.rounds, confidence=s.confidence,
                               decode_path=DECODE_PATH),
        workload=workload.workload, ttft_ms_max=workload.ttft_ms_max,
        decode_tokens_per_s_min=workload.decode_tokens_per_s_min, candidates=models, not_built=not_built or {},
        searches=searches or {}, selected=selected, selection_reason=reason, passed=selected != "baseline")
