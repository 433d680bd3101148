"""The FP32 ONNX baseline against its source framework on the recipe's text (an export alone can move a model's
perplexity): per sequence, the baseline's mean next-token NLL minus the source's (a paired difference, its
t-interval over sequences as validators/perplexity.py), and the share of positions where both pick the same next
token. Gated both ways: the interval must lie within +-nll_delta_max (an export that lowers the NLL is as wrong)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from temper.validators.decoder_report import DecoderGate, ExportCheck
from temper.validators.decoder_spec import ExportSpec
from temper.validators.perplexity import Logits, paired_interval, sequence_nll


def check(source: str, view: dict[str, list], sequences: Sequence[Sequence[int]], baseline: Logits,
          spec: ExportSpec, confidence: float) -> ExportCheck:
    nll: list[float] = []
    same = total = 0
    for ids, argmax in zip(sequences, view["argmax"]):
        value, logp = sequence_nll(baseline(ids), ids)
        nll.append(value)
        same += int((logp.argmax(-1) == np.asarray(argmax)).sum())
        total += len(argmax)
    delta = paired_interval([b - s for b, s in zip(nll, view["nll"])], confidence)
    low = delta.low if delta.low is not None else delta.mean
    high = delta.high if delta.high is not None else delta.mean
    agreement = same / total
    interval = (delta.low, delta.high) if delta.low is not None and delta.high is not None else None
    gates = [
        DecoderGate(name="export.nll_delta", kind="export", passed=-spec.nll_delta_max <= low and high <=
                    spec.nll_delta_max, measured=delta.mean, budget=spec.nll_delta_max, interval=interval,
                    detail=f"ONNX baseline NLL minus {source}'s, nats/token: its {confidence:.0%} interval over "
                           f"{delta.pairs} sequences must lie within +-{spec.nll_delta_max:g}"),
        DecoderGate(name="export.agreement", kind="export", passed=agreement >= spec.agreement_min,
                    measured=agreement, budget=spec.agreement_min, interval=None,
                    detail=f"next-token argmax equal to {source}'s on {total} tokens"),
    ]
    return ExportCheck(source=source, source_perplexity=math.exp(float(np.mean(view["nll"]))),
                       nll_delta=delta.mean, nll_delta_interval=interval, agreement=agreement, gates=gates,
                       passed=all(g.passed for g in gates))
