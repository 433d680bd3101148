"""A decoder's speed the way it is used: time to first token (the prefill of the recipe's prompt length) and
decode tokens/s (greedy steps with the KV cache growing), each paired with the baseline round by round.

Every round times the baseline and each model back to back, in an order that rotates each round, so a burst of
load hits all alike; the round's time ratio (baseline / model: above 1 is faster) is one paired observation and
validators/speedup.py turns the rounds into a geometric mean with its t-interval, as the CNN speed gates do. The
absolute figures (milliseconds, tokens/s) are the medians over rounds. The decode path is
artifacts/engines/decoder_session.py's: the prompt in one call, then one token per call, no IO binding.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from temper.artifacts.engines.decoder_session import DecoderSession
from temper.validators.speedup import Speedup, estimate


@dataclass(frozen=True)
class DecodeSpeed:
    """One model's figures, and its speedups over the reference (None for the reference itself)."""

    ttft_ms: float  # median over rounds
    decode_tokens_per_s: float  # median over rounds, per sequence times the batch
    ttft_speedup: Speedup | None
    decode_speedup: Speedup | None


def measure(sessions: Mapping[str, DecoderSession], reference: str, *, prompt_length: int, decode_tokens: int,
            batch_size: int, rounds: int, confidence: float, seed: int = 0) -> dict[str, DecodeSpeed]:
    """Time every session for `rounds` interleaved rounds (after one untimed warm-up each) on the same prompt."""
    vocab = sessions[reference].layout.vocab_size
    prompt = np.random.default_rng(seed).integers(3, vocab, size=(batch_size, prompt_length), dtype=np.int64)
    names = list(sessions)
    for session in sessions.values():  # warm-up: allocations and kernels chosen, untimed
        session.time_prefill(prompt)
        session.time_decode(prompt, min(decode_tokens, 4))
    prefill: dict[str, list[float]] = {name: [] for name in names}
    decode: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            session = sessions[name]
            prefill[name].append(min(session.time_prefill(prompt) for _ in range(3)))
            decode[name].append(session.time_decode(prompt, decode_tokens))
    result: dict[str, DecodeSpeed] = {}
    for name in names:
        mine_p, mine_d = np.asarray(prefill[name]), np.asarray(decode[name])
        ref_p, ref_d = np.asarray(prefill[reference]), np.asarray(decode[reference])
        is_ref = name == reference
        result[name] = DecodeSpeed(
            ttft_ms=float(np.median(mine_p) * 1e3),
            decode_tokens_per_s=float(np.median(decode_tokens * batch_size / mine_d)),
            ttft_speedup=None if is_ref else estimate(list(ref_p / mine_p), confidence),
            decode_speedup=None if is_ref else estimate(list(ref_d / mine_d), confidence))
    return result
