"""Reports for people and machines: report.json (the CI contract), report.md, junit.xml, PNG plots."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; never a display
import matplotlib.pyplot as plt  # noqa: E402


def write(report: dict[str, Any], folder: Path) -> list[Path]:
    """Write every report file into `folder`; plots only where there is something to plot."""
    written = [folder / "report.json", folder / "report.md", folder / "junit.xml"]
    written[0].write_text(json.dumps(report, indent=2) + "\n")
    written[1].write_text(markdown(report))
    junit(report).write(written[2], encoding="utf-8", xml_declaration=True)
    if report["baseline"]["throughput"]:
        written.append(_throughput_plot(report, folder / "throughput.png"))
        if report["metric"]:
            written.append(_tradeoff_plot(report, folder / "tradeoff.png"))
    for name, c in report["candidates"].items():
        if c["tuning"] and c["tuning"]["ranking"]:
            written.append(_sensitivity_plot(name, c["tuning"], folder / f"sensitivity-{name}.png"))
    return written


def markdown(report: dict[str, Any]) -> str:
    verdict = f"**passed** — selected `{report['selected']}`" if report["passed"] else "**failed** — no candidate passed every gate"
    lines = [f"# temper report: {report['recipe']}", "", verdict, ""]
    metric = report["metric"]
    head = "| candidate | verdict | size | " + (f"{metric} | drop | " if metric else "") + "failed gates |"
    lines += [head, "|" + "---|" * (head.count("|") - 1)]
    if metric:
        lines.append(f"| baseline | — | — | {report['baseline']['metric']:.4f} | — | — |")
    for name, c in report["candidates"].items():
        failed = ", ".join(g["name"] for g in c["gates"] if not g["passed"]) or "—"
        size = f"{c['bytes'] / 1024:,.0f} KiB" if c["bytes"] else "—"
        row = f"| {name} | {'pass' if c['passed'] else 'FAIL'} | {size} | "
        if metric:
            row += (f"{c['metric']:.4f} | {c['drop']:+.4f} (max {report['allowed_drop']:.4f}) | " if c["metric"] is not None else "— | — | ")
        lines.append(row + failed + " |")
    if report["baseline"]["throughput"]:
        lines += ["", "## Throughput (samples/s; speedup over baseline)", "",
                  "| model | provider | batch | samples/s | speedup | p50 ms | p99 ms | peak RSS MB |",
                  "|---|---|---|---|---|---|---|---|"]
        rows = [("baseline", {**m, "speedup": 1.0}) for m in report["baseline"]["throughput"]]
        rows += [(n, m) for n, c in report["candidates"].items() for m in c["throughput"]]
        for name, m in rows:
            lines.append(f"| {name} | {m['provider']} | {m['batch_size']} | {m['samples_per_s']:,.0f} | "
                         f"{m['speedup']:.2f}x | {m['latency_ms']['p50']:.3f} | {m['latency_ms']['p99']:.3f} | {m['peak_rss_mb']:,.0f} |")
    for name, search in report["searches"].items():
        lines += _search_section(name, search, report)
    for name, c in report["candidates"].items():
        if c["tuning"]:
            lines += _tuning_section(name, c["tuning"])
    failures = [(n, g) for n, c in report["candidates"].items() for g in c["gates"] if not g["passed"]]
    if failures:
        lines += ["", "## Failed gates", ""] + [f"- `{n}` {g['name']}: {g['detail']}" for n, g in failures]
    return "\n".join(lines) + "\n"


RANKING_ROWS = 15  # the table; tuning.json holds the whole ranking


def _search_section(name: str, search: dict[str, Any], report: dict[str, Any]) -> list[str]:
    lines = ["", f"## Search: {name} ({len(search['trials'])} of {search['combinations']} combinations built)", "",
             "| trial | verdict | drop | samples/s (largest batch) |", "|---|---|---|---|"]
    for trial in search["trials"]:
        c = report["candidates"][trial]
        speed = max(c["throughput"], key=lambda m: m["batch_size"])["samples_per_s"] if c["throughput"] else None
        lines.append(f"| {trial} | {'pass' if c['passed'] else 'FAIL'} | "
                     f"{'—' if c['drop'] is None else format(c['drop'], '+.4f')} | {'—' if speed is None else format(speed, ',.0f')} |")
    if search["combinations"] > len(search["trials"]):
        lines += ["", f"{search['combinations'] - len(search['trials'])} combinations not built: raise max_trials to try them."]
    return lines


def _tuning_section(name: str, tuning: dict[str, Any]) -> list[str]:
    outcome = "met" if tuning["met"] else "**not met**: the best model found is kept (the smallest drop)"
    lines = ["", f"## Fallback: {name}", "",
             f"Budget: {tuning['metric']} drop at most {tuning['allowed_drop']:.4f} from {tuning['baseline_metric']:.4f}; "
             f"{outcome}; {len(tuning['trials'])} of at most {tuning['max_trials']} trials; kept: trial {tuning['best']}.", "",
             "| trial | kind | nodes in float | metric | drop | cosine | samples/s | gates |", "|---|---|---|---|---|---|---|---|"]
    for index, t in enumerate(tuning["trials"]):
        speed = "—" if t["samples_per_s"] is None else f"{t['samples_per_s']:,.0f}"
        lines.append(f"| {index}{' (kept)' if index == tuning['best'] else ''} | {t['kind']} | {len(t['float_nodes'])} | "
                     f"{t['metric']:.4f} | {t['drop']:+.4f} | {t['cosine']:.4f} | {speed} | {'held' if t['passed'] else 'missed'} |")
    kept = tuning["trials"][tuning["best"]]["float_nodes"]
    if kept:
        lines += ["", "Kept in float: " + ", ".join(f"`{n}`" for n in kept)]
    if tuning["ranking"]:
        lines += ["", "Sensitivity (most harmful first; SQNR of the quantized tensors a node touches, dB; "
                      "-200 = NaN/Inf where the float model has numbers):", "",
                  "| rank | node | op | SQNR dB | output SQNR vs float dB |", "|---|---|---|---|---|"]
        for rank, r in enumerate(tuning["ranking"][:RANKING_ROWS], 1):
            acc = "—" if r["accumulated_db"] is None else f"{r['accumulated_db']:.1f}"
            lines.append(f"| {rank} | `{r['node']}` | {r['op_type']} | {r['sqnr_db']:.1f} | {acc} |")
    return lines


def junit(report: dict[str, Any]) -> ET.ElementTree:
    """One test case per candidate gate, so a CI system shows exactly which gate failed."""
    cases = [(name, gate) for name, c in report["candidates"].items() for gate in c["gates"]]
    failures = sum(not g["passed"] for _, g in cases)
    suite = ET.Element("testsuite", name=f"temper.{report['recipe']}", tests=str(len(cases)),
                       failures=str(failures), errors="0", skipped="0")
    for name, gate in cases:
        case = ET.SubElement(suite, "testcase", classname=f"{report['recipe']}.{name}", name=gate["name"])
        if not gate["passed"]:
            ET.SubElement(case, "failure", message=gate["detail"], type="gate").text = json.dumps(gate)
    root = ET.Element("testsuites", tests=str(len(cases)), failures=str(failures))
    root.append(suite)
    return ET.ElementTree(root)


def _throughput_plot(report: dict[str, Any], path: Path) -> Path:
    series = {"baseline": report["baseline"]["throughput"]} | {n: c["throughput"] for n, c in report["candidates"].items()}
    providers = sorted({m["provider"] for ms in series.values() for m in ms})
    fig, axes = plt.subplots(1, len(providers), figsize=(6 * len(providers), 4), squeeze=False)
    for ax, provider in zip(axes[0], providers):
        for name, ms in series.items():
            points = sorted((m["batch_size"], m["samples_per_s"]) for m in ms if m["provider"] == provider)
            if points:
                ax.plot(*zip(*points), marker="o", label=name, linestyle="--" if name == "baseline" else "-")
        sizes = sorted({m["batch_size"] for ms in series.values() for m in ms})
        ax.set(xscale="log", yscale="log", xlabel="batch size", ylabel="samples/s", title=f"{report['recipe']} on {provider}")
        ax.set_xticks(sizes, [str(b) for b in sizes])
        ax.minorticks_off()
        ax.legend()
        ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _tradeoff_plot(report: dict[str, Any], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, c in report["candidates"].items():
        if c["drop"] is None or not c["throughput"]:
            continue
        best = max(c["throughput"], key=lambda m: m["batch_size"])
        ax.scatter(best["speedup"], c["drop"], color="tab:green" if c["passed"] else "tab:red")
        ax.annotate(name, (best["speedup"], c["drop"]), textcoords="offset points", xytext=(5, 5))
    ax.axhline(report["allowed_drop"], color="gray", linestyle="--", label="allowed drop")
    ax.axvline(1.0, color="gray", linestyle=":", label="baseline speed")
    ax.set(xlabel="speedup over baseline (largest batch)", ylabel=f"{report['metric']} drop", title=f"{report['recipe']}: accuracy vs speed")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _sensitivity_plot(name: str, tuning: dict[str, Any], path: Path) -> Path:
    top = tuning["ranking"][:20]
    fig, ax = plt.subplots(figsize=(8, 0.3 * len(top) + 1.5))
    labels = [r["node"] if len(r["node"]) <= 60 else "…" + r["node"][-59:] for r in top]
    ax.barh(range(len(top)), [r["sqnr_db"] for r in top], color="tab:red")
    ax.set_yticks(range(len(top)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set(xlabel="SQNR of the quantized tensors it touches (dB; lower = more harmful)",
           title=f"{name}: top {len(top)} nodes by quantization sensitivity")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
