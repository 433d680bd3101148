"""The decoder gates' pure cores: the paired interval on NLL deltas, the loop detector, the workload selection,
and the decoder report's shipped JSON Schema."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import numpy as np
import pytest

from temper.artifacts.engines.decoder_session import repetition
from temper.validators.decoder_report import DecoderGate, DecoderModel, Generation, Speed, schema_text
from temper.validators.decoder_selection import select
from temper.validators.perplexity import log_softmax, paired_interval, sequence_nll

SCHEMA_FILE = Path(__file__).resolve().parents[2] / "validators" / "decoder_report.schema.json"


def test_the_shipped_decoder_schema_is_the_generated_one() -> None:
    assert SCHEMA_FILE.read_text() == schema_text(), (
        "validators/decoder_report.schema.json is stale: "
        "python -m temper.validators.decoder_report > validators/decoder_report.schema.json")
    jsonschema.Draft202012Validator.check_schema(__import__("json").loads(schema_text()))


def test_the_paired_interval_is_a_t_interval_on_the_differences() -> None:
    paired = paired_interval([0.1, 0.2, 0.3], 0.95)
    assert paired.mean == pytest.approx(0.2)
    half = 4.302652729911275 * 0.1 / np.sqrt(3)  # t(0.975, 2) * s / sqrt(n)
    assert (paired.low, paired.high) == (pytest.approx(0.2 - half), pytest.approx(0.2 + half))
    assert paired_interval([0.5], 0.95).low is None


def test_sequence_nll_is_the_mean_negative_log_probability_of_each_next_token() -> None:
    logits = np.log(np.asarray([[0.5, 0.25, 0.25], [0.1, 0.8, 0.1], [1 / 3, 1 / 3, 1 / 3]]))
    nll, logp = sequence_nll(logits, [0, 1, 2])
    assert nll == pytest.approx(-(np.log(0.25) + np.log(0.1)) / 2)
    assert np.exp(log_softmax(logits)).sum(axis=-1) == pytest.approx(np.ones(3))
    assert logp.shape == (2, 3)


@pytest.mark.parametrize(("tokens", "found"), [
    ([5, 1, 2, 1, 2, 1, 2, 1, 2], (2, 4)),
    ([7, 7, 7, 7], (1, 4)),
    ([1, 2, 3, 1, 2, 3, 1, 2, 3], None),  # three repeats: not yet a loop
    ([1, 2, 3, 4, 5, 6, 7, 8], None),
])
def test_a_loop_is_a_short_span_repeated_at_the_end(tokens: list[int], found: tuple[int, int] | None) -> None:
    assert repetition(tokens, 8, 4) == found


def _model(name: str, *, ttft: float, tps: float, ttft_x: tuple[float, float, float] | None,
           decode_x: tuple[float, float, float] | None, passed: bool = True, size: float = 1.0) -> DecoderModel:
    speed = Speed(ttft_ms=ttft, decode_tokens_per_s=tps, ttft_speedup=ttft_x[0] if ttft_x else None,
                  ttft_speedup_interval=ttft_x[1:] if ttft_x else None,
                  decode_speedup=decode_x[0] if decode_x else None,
                  decode_speedup_interval=decode_x[1:] if decode_x else None, rounds=5)
    gate = DecoderGate(name="nll_delta", kind="quality", passed=passed, measured=0.0, budget=0.05, interval=None,
                       detail="")
    return DecoderModel(weights={"method": name}, census={}, size_mb=size, quality=None,
                        generation=Generation(stopped=["length"], tokens=[8]), speed=speed, gates=[gate],
                        passed=passed, meets_workload=True)


def test_each_workload_gets_its_own_format_and_the_reason_says_so() -> None:
    base = _model("fp32", ttft=100, tps=10, ttft_x=None, decode_x=None)
    candidates = {
        "int8": _model("int8", ttft=30, tps=18, ttft_x=(3.3, 3.1, 3.5), decode_x=(1.8, 1.7, 1.9)),
        "q4": _model("q4", ttft=66, tps=40, ttft_x=(1.5, 1.4, 1.6), decode_x=(4.0, 3.8, 4.2)),
    }
    chosen, reason = select(candidates, base, "decode", None, None)
    assert chosen == "q4" and "decode tokens/s 4.00x [3.80, 4.20]" in reason and "prefill-heavy workload would " \
        "get int8" in reason
    chosen, reason = select(candidates, base, "prefill", None, None)
    assert chosen == "int8" and "decode-heavy workload would get q4" in reason


def test_limits_noise_and_failed_gates_keep_a_candidate_out() -> None:
    base = _model("fp32", ttft=100, tps=10, ttft_x=None, decode_x=None)
    noisy = _model("noisy", ttft=90, tps=11, ttft_x=(1.1, 0.9, 1.3), decode_x=(1.1, 0.95, 1.3))
    failed = _model("bad", ttft=20, tps=50, ttft_x=(5, 4, 6), decode_x=(5, 4, 6), passed=False)
    slow = _model("slow", ttft=300, tps=40, ttft_x=(2, 1.9, 2.1), decode_x=(4, 3.9, 4.1))
    slow = slow.model_copy(update={"meets_workload": False})
    chosen, reason = select({"noisy": noisy, "bad": failed, "slow": slow}, base, "decode", 200, None)
    assert chosen == "baseline"
    assert "noisy: not evidently faster" in reason and "bad: failed nll_delta" in reason
    assert "slow: misses the workload's limits (TTFT 300.0 ms > 200)" in reason and "TTFT <= 200 ms" in reason
    assert "the baseline misses" not in reason  # its 100 ms meet the limit


def test_a_baseline_missing_the_limits_too_is_said() -> None:
    base = _model("fp32", ttft=380, tps=14, ttft_x=None, decode_x=None)
    q8 = _model("q8", ttft=348, tps=35, ttft_x=(1.1, 0.9, 1.3), decode_x=(2.5, 2.0, 3.0))
    chosen, reason = select({"q8": q8.model_copy(update={"meets_workload": False})}, base, "decode", 200, 20)
    assert chosen == "baseline"
    assert "q8: misses the workload's limits (TTFT 348.0 ms > 200)" in reason
    assert "the baseline misses them too (TTFT 380.0 ms > 200, decode 14.0 tokens/s < 20)" in reason
