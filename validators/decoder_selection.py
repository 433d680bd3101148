"""Which decoder candidate a workload gets, and why, as pure functions of the report's models.

A candidate is eligible when it passed every gate, its medians meet the recipe's limits (`ttft_ms_max`,
`decode_tokens_per_s_min`), and it is evidently faster than the FP32 baseline on the workload's own figure (the
lower end of that speedup's interval above 1): decode tokens/s for `workload: decode`, time to first token for
`prefill`. The eligible one with the highest speedup on that figure wins (ties: the smaller files). Decode is
memory-bound and prefill compute-bound, so the two workloads can pick different formats; the reason says so.
"""

from __future__ import annotations

from temper.validators.decoder_report import DecoderModel, Speed


def meets(speed: Speed | None, ttft_ms_max: float | None, tokens_per_s_min: float | None) -> bool:
    if speed is None:
        return False
    return ((ttft_ms_max is None or speed.ttft_ms <= ttft_ms_max)
            and (tokens_per_s_min is None or speed.decode_tokens_per_s >= tokens_per_s_min))


def _figure(speed: Speed, workload: str) -> tuple[float | None, tuple[float, float] | None]:
    if workload == "decode":
        return speed.decode_speedup, speed.decode_speedup_interval
    return speed.ttft_speedup, speed.ttft_speedup_interval


def _shown(speed: Speed, workload: str) -> str:
    ratio, interval = _figure(speed, workload)
    spread = f" [{interval[0]:.2f}, {interval[1]:.2f}]" if interval else ""
    what = "decode tokens/s" if workload == "decode" else "time-to-first-token speedup"
    return f"{what} {ratio:.2f}x{spread} the baseline's"


def missed(speed: Speed, ttft_ms_max: float | None, tokens_per_s_min: float | None) -> str:
    """Which of the workload's limits `speed` misses, in words."""
    parts = []
    if ttft_ms_max is not None and speed.ttft_ms > ttft_ms_max:
        parts.append(f"TTFT {speed.ttft_ms:.1f} ms > {ttft_ms_max:g}")
    if tokens_per_s_min is not None and speed.decode_tokens_per_s < tokens_per_s_min:
        parts.append(f"decode {speed.decode_tokens_per_s:.1f} tokens/s < {tokens_per_s_min:g}")
    return ", ".join(parts)


def pick(candidates: dict[str, DecoderModel], workload: str, ttft_ms_max: float | None = None,
         tokens_per_s_min: float | None = None) -> tuple[str | None, list[str]]:
    """The winner for `workload` (None when none is eligible), and one line per candidate passed over."""
    eligible: list[tuple[float, float, str]] = []
    passed_over: list[str] = []
    for name, model in candidates.items():
        if not model.passed:
            failed = [g.name for g in model.gates if not g.passed]
            passed_over.append(f"{name}: failed {', '.join(failed)}")
            continue
        if not model.meets_workload or model.speed is None:
            why = missed(model.speed, ttft_ms_max, tokens_per_s_min) if model.speed else "not timed"
            passed_over.append(f"{name}: misses the workload's limits ({why})")
            continue
        ratio, interval = _figure(model.speed, workload)
        if ratio is None or interval is None or interval[0] <= 1.0:
            passed_over.append(f"{name}: not evidently faster than the baseline ({_shown(model.speed, workload)})")
            continue
        eligible.append((-ratio, model.size_mb, name))
    return (min(eligible)[2] if eligible else None), passed_over


def select(candidates: dict[str, DecoderModel], baseline: DecoderModel, workload: str,
           ttft_ms_max: float | None, tokens_per_s_min: float | None) -> tuple[str, str]:
    """(selected, reason): the workload's pick, else the baseline with why no candidate was picked."""
    winner, passed_over = pick(candidates, workload, ttft_ms_max, tokens_per_s_min)
    other = "prefill" if workload == "decode" else "decode"
    other_winner, _ = pick(candidates, other, ttft_ms_max, tokens_per_s_min)
    limits = ", ".join(part for part in (f"TTFT <= {ttft_ms_max:g} ms" if ttft_ms_max else "",
                                         f"decode >= {tokens_per_s_min:g} tokens/s" if tokens_per_s_min else "")
                       if part) or "no limits"
    if winner is None:
        base_ok = meets(baseline.speed, ttft_ms_max, tokens_per_s_min)
        why = "; ".join(passed_over) or "no candidate"
        base_miss = "" if base_ok or baseline.speed is None else missed(baseline.speed, ttft_ms_max, tokens_per_s_min)
        return "baseline", (f"no candidate is eligible for the {workload} workload ({limits}): {why}"
                            + (f"; the baseline misses them too ({base_miss})" if base_miss else ""))
    model = candidates[winner]
    assert model.speed is not None
    reason = (f"{winner}: fastest for the {workload} workload, {_shown(model.speed, workload)} "
              f"(TTFT {model.speed.ttft_ms:.1f} ms, {model.speed.decode_tokens_per_s:.1f} tokens/s; {limits})")
    if other_winner is not None and other_winner != winner:
        reason += f"; a {other}-heavy workload would get {other_winner}"
    return winner, reason
