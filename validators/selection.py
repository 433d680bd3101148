"""Why the selection is what it is, in one line for report.json, report.md and the console: for a selected
candidate, its evidence over the baseline and the pairs it tied with (validators/gates.py's rule); for the
baseline, each candidate's first failed gate or why one that passed is not better."""

from __future__ import annotations

from temper.artifacts.core.host import HostProfile
from temper.validators.gates import Selection, Verdict
from temper.validators.spec import ValidateSpec


def why_selected(selection: Selection, verdicts: list[Verdict], rule: str, spec: ValidateSpec,
                 baseline_bytes: int) -> str:
    """One line: why `selection.name` was selected over the baseline and over every other passing pair."""
    by_name = {v.name: v for v in verdicts}
    chosen = by_name[selection.name or ""]
    others = [v for v in verdicts if v.passed and v is not chosen]
    if rule == "smallest-passing":
        line = (f"{chosen.name} passed every gate and is the smallest: {chosen.bytes or 0:,} bytes against the "
                f"baseline's {baseline_bytes:,}")
    else:
        assert spec.throughput is not None and chosen.speedup is not None  # beats_baseline: a measured interval
        where = f"at batch {max(spec.throughput.batch_sizes)} on {spec.throughput.providers[0]}"
        line = (f"{chosen.name} passed every gate and is {chosen.speedup.shown()} the baseline {where} "
                f"({chosen.speedup.confidence:.0%}): faster on its interval")
    if selection.ties:
        measure = "speed" if rule == "fastest-passing" else "size and speed"
        tied = "; ".join(f"{t.name} ({'speed not measured' if t.speedup is None else t.speedup.shown() + ' of it'}"
                         f", paired; worst cosine {_cosine(t.fidelity)})" for t in selection.ties)
        leader = f" ({selection.leader} had the largest speedup)" if selection.leader else ""
        line += (f"; tied on {measure} with {tied}: the interval holds 1.0, so the more faithful pair is selected"
                 f"{leader}, worst cosine {_cosine(chosen.fidelity)}")
    elif others:
        line += f"; {len(others)} other passing pair{'s' if len(others) > 1 else ''} ranked below it"
    return line


def _cosine(value: float | None) -> str:
    return "not measured" if value is None else f"{value:.4f}"


def why_baseline(results: list[tuple[Verdict, str]], host: HostProfile, precisions: dict[str, str],
                 rule: str = "fastest-passing", spec: ValidateSpec | None = None,
                 baseline_bytes: int | None = None) -> str:
    """One line: why the FP32 baseline is the honest answer. Each candidate's first failed gate, and
    what about this host explains a speed miss; for one that passed every gate, why it does not beat
    the baseline (gates.beats_baseline). `results`: each pair's verdict and the model it is of."""
    clauses = []
    for verdict, model in results:
        name = verdict.name
        if verdict.passed:
            clauses.append(_not_better(verdict, rule, spec, baseline_bytes))
            continue
        gate = next(g for g in verdict.gates if not g.passed)
        if gate.kind == "throughput":
            what = (f"{name} is {gate.measured:.2f}x the baseline at batch {gate.batch_size}"
                    if gate.verdict == "fail"
                    else f"{name}'s speedup could not be told from noise ({gate.measured:.2f}x)")
            hint = _host_hint(precisions.get(model, ""), host, gate.provider or "")
            clauses.append(what + (f": {hint}" if hint else ""))
        elif gate.kind == "build":
            clauses.append(f"{name} did not build")
        else:
            clauses.append(f"{name} failed {gate.name} ({gate.detail})")
    if not any(verdict.passed for verdict, _ in results):
        return "no candidate passed every gate on this host, so the FP32 baseline is selected: " + "; ".join(clauses)
    better = "faster than the baseline on its speedup interval" if rule == "fastest-passing" else "smaller"
    return (f"no candidate that passed every gate is {better} ({rule}), so the FP32 baseline is selected: "
            + "; ".join(clauses))


def _not_better(verdict: Verdict, rule: str, spec: ValidateSpec | None, baseline_bytes: int | None) -> str:
    """Why a candidate that passed every gate is not selected over the baseline."""
    name = verdict.name
    if rule == "smallest-passing":
        return f"{name} is {verdict.bytes or 0:,} bytes, not smaller than the baseline's {baseline_bytes or 0:,}"
    if spec is None or spec.throughput is None or verdict.speedup is None:
        return (f"{name} passed every gate but speed was not measured (no validate.throughput), so nothing shows "
                "it faster: add validate.throughput or use select: smallest-passing")
    up = verdict.speedup
    where = f"at batch {max(spec.throughput.batch_sizes)} on {spec.throughput.providers[0]}"
    if up.low is None or up.high is None:
        return f"{name} passed every gate but is {up.shown()} the baseline {where}, too few rounds for an interval"
    how = "slower" if up.high < 1.0 else "not evidently faster (the interval does not lie above 1.0)"
    return f"{name} passed every gate but is {up.shown()} the baseline {where} ({up.confidence:.0%}): {how}"


def _host_hint(precision: str, host: HostProfile, provider: str) -> str | None:
    """What about this CPU makes a precision slow: the reason a speed gate missed, said plainly."""
    if provider != "cpu":
        return None
    if precision.startswith("int8") and host.x86 and host.features_known and not host.vnni:
        return f"this CPU ({host.cpu}) has no VNNI, so ONNX Runtime's INT8 kernels gain little or nothing over FP32"
    if (precision == "fp16" and host.features_known
            and "avx512_fp16" not in host.features and "fp16" not in host.features):
        return f"this CPU ({host.cpu}) has no FP16 arithmetic, so FP16 runs through conversions to FP32"
    return None


