"""A decoder candidate's quality against its baseline on the recipe's text, teacher-forced.

Each sequence is run once through each model; per sequence the mean next-token NLL (nats per token) of each
model gives one PAIRED observation, candidate minus baseline, so text that is hard for both cancels out and the
interval is on the difference itself (a Student-t interval over sequences, as validators/speedup.py puts one on
log speed ratios). Pooled over every predicted token: how often the candidate's top token is the baseline's
(next-token agreement), and the mean KL divergence KL(baseline || candidate) of the next-token distributions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

Logits = Callable[[Sequence[int]], np.ndarray]  # one sequence -> logits [tokens, vocab]


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits.astype(np.float64) - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


@dataclass(frozen=True)
class Paired:
    """The mean of paired differences with its t-interval (None below two pairs)."""

    mean: float
    low: float | None
    high: float | None
    pairs: int
    confidence: float


def paired_interval(differences: Sequence[float], confidence: float) -> Paired:
    values = np.asarray(differences, np.float64)
    mean = float(values.mean())
    if len(values) < 2:
        return Paired(mean, None, None, len(values), confidence)
    half = float(stats.t.ppf((1 + confidence) / 2, len(values) - 1) * values.std(ddof=1) / math.sqrt(len(values)))
    return Paired(mean, mean - half, mean + half, len(values), confidence)


@dataclass(frozen=True)
class Quality:
    """One candidate against the baseline on the same sequences."""

    baseline_nll: list[float]  # per sequence, nats per token
    candidate_nll: list[float]
    delta: Paired  # candidate - baseline, nats per token
    agreement: float  # share of predicted tokens whose argmax is the baseline's
    kl: float  # mean KL(baseline || candidate) per predicted token, nats
    tokens: int

    @property
    def baseline_perplexity(self) -> float:
        return math.exp(float(np.mean(self.baseline_nll)))

    @property
    def candidate_perplexity(self) -> float:
        return math.exp(float(np.mean(self.candidate_nll)))


def sequence_nll(logits: np.ndarray, ids: Sequence[int]) -> tuple[float, np.ndarray]:
    """Mean NLL of tokens 1.. given the logits of positions ..-1, and those positions' log-probabilities."""
    logp = log_softmax(logits[:-1])
    targets = np.asarray(ids[1:])
    return float(-logp[np.arange(len(targets)), targets].mean()), logp


def compare(sequences: Sequence[Sequence[int]], baseline: Logits, candidate: Logits, confidence: float) -> Quality:
    """Run both models on every sequence (each at least two tokens) and compare them."""
    base_nll: list[float] = []
    cand_nll: list[float] = []
    agree = kl_sum = 0.0
    tokens = 0
    for ids in sequences:
        b_nll, b_logp = sequence_nll(baseline(ids), ids)
        c_nll, c_logp = sequence_nll(candidate(ids), ids)
        base_nll.append(b_nll)
        cand_nll.append(c_nll)
        agree += float((b_logp.argmax(-1) == c_logp.argmax(-1)).sum())
        kl_sum += float((np.exp(b_logp) * (b_logp - c_logp)).sum())
        tokens += len(b_logp)
    delta = paired_interval([c - b for b, c in zip(base_nll, cand_nll)], confidence)
    return Quality(base_nll, cand_nll, delta, agree / tokens, kl_sum / tokens, tokens)
