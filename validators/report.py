"""Reports for people and machines: report.json (the CI contract), report.md, junit.xml, PNG plots."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from temper.validators import report_plots as plots
from temper.validators.report_model import FILE, Candidate, CandidateMeasurement, Report, Tuning, dumps

Readable = Report | Mapping[str, Any]  # a Report, or report.json's dict (validated on the way in)


MARKDOWN, JUNIT, THROUGHPUT_PLOT, TRADEOFF_PLOT = "report.md", "junit.xml", "throughput.png", "tradeoff.png"


def is_output(name: str) -> bool:
    """Whether `write` writes a file of this name: what `temper validate` replaces, and keeps nothing of."""
    return (name in (FILE, MARKDOWN, JUNIT, THROUGHPUT_PLOT, TRADEOFF_PLOT)
            or (name.startswith("sensitivity-") and name.endswith(".png")))


def write(report: Readable, folder: Path) -> list[Path]:
    """Write every report file into `folder`; plots only where there is something to plot."""
    report = Report.model_validate(report)
    written = [folder / FILE, folder / MARKDOWN, folder / JUNIT]
    written[0].write_text(dumps(report))
    written[1].write_text(markdown(report))
    junit(report).write(written[2], encoding="utf-8", xml_declaration=True)
    if report.baseline.throughput:
        written.append(plots.throughput_plot(report, folder / THROUGHPUT_PLOT))
        if report.metric:
            written.append(plots.tradeoff_plot(report, folder / TRADEOFF_PLOT))
    for name, c in report.candidates.items():
        if c.tuning and c.tuning.ranking:
            written.append(plots.sensitivity_plot(name, c.tuning, folder / f"sensitivity-{name}.png"))
    return written


def speedup_text(m: CandidateMeasurement | Mapping[str, Any]) -> str:
    """`1.40x [1.36, 1.44]`: a throughput entry's speedup and its confidence interval."""
    if isinstance(m, Mapping):  # report.json's dict, or just its speedup and interval
        speedup, interval = m["speedup"], m.get("speedup_interval")
    else:
        speedup, interval = m.speedup, m.speedup_interval
    return f"{speedup:.2f}x" + (f" [{interval[0]:.2f}, {interval[1]:.2f}]" if interval else "")


def engine_line(report: Report) -> str:
    """The selected pair: the model, the engine it was gated on and serves on, what that engine computes
    float ops in (read back from it) and the settings it was measured with."""
    pair = report.selected_pair
    candidate = report.candidates.get(pair)
    computes = candidate.engine_precision if candidate else None
    settings = report.session_of(pair)
    shown = ", ".join(f"{k} {v}" for k, v in settings.model_dump().items()) if settings else "not measured"
    line = (f"`{report.selected}` on `{report.selected_engine}`, computing float ops in "
            f"{computes or 'the graph’s own precision'}; settings: {shown}")
    return line + (f"; {short}" if candidate and (short := engine_shortfall(candidate)) else "")


def engine_shortfall(candidate: Candidate) -> str | None:
    """What the engine runs in float of the compute nodes the graph quantized, in words; None when it
    runs them all in INT8 (or nothing was counted)."""
    graph, engine = candidate.census, candidate.engine_census
    if graph is None or engine is None or engine.quantized >= graph.quantized:
        return None
    return (f"ONNX Runtime runs {engine.quantized} of the graph's {graph.quantized} quantized compute nodes in "
            f"INT8 ({engine.fp32 + engine.fp16} compute on dequantized values in float)")


def int8_shortfall(candidate: Candidate) -> str | None:
    """The console's line beside a verdict: `ONNX Runtime runs 1 of 43 quantized nodes in INT8 (42 in float on
    dequantized values: ...)`; None when ONNX Runtime runs every node the graph quantized in INT8."""
    graph, engine = candidate.census, candidate.engine_census
    if graph is None or engine is None or engine.quantized >= graph.quantized:
        return None
    return (f"ONNX Runtime runs {engine.quantized} of {graph.quantized} quantized nodes in INT8 "
            f"({graph.quantized - engine.quantized} in float on dequantized values: their Q/DQ is not where its "
            "INT8 kernels fuse, e.g. NNCF's after a SiLU; see docs/recipes.md)")


def markdown(report: Readable) -> str:
    report = Report.model_validate(report)
    verdict = (f"**passed** — selected `{report.selected_pair}`: {report.selection_reason}" if report.passed
               else f"**no candidate passed** — selected `baseline`: {report.selection_reason}")
    lines = [f"# temper report: {report.recipe}", "", verdict, "", f"Serving: {engine_line(report)}", "",
             *_not_built_lines(report), *_disagreement_lines(report), *_host_lines(report), ""]
    metric = report.metric
    head = "| candidate | verdict | size | " + (f"{metric} | drop | " if metric else "") + "failed gates |"
    lines += [head, "|" + "---|" * (head.count("|") - 1)]
    if metric:
        lines.append(f"| baseline | — | — | {report.baseline.metric:.4f} | — | — |")
    for name, c in report.candidates.items():
        failed = ", ".join(g.name for g in c.gates if not g.passed) or "—"
        size = f"{c.bytes / 1024:,.0f} KiB" if c.bytes else "—"
        row = f"| {name} | {'pass' if c.passed else 'FAIL'} | {size} | "
        if metric:
            row += (f"{c.metric:.4f} | {c.drop:+.4f} (max {report.allowed_drop:.4f}) | " if c.metric is not None
                    else "— | — | ")
        lines.append(row + failed + " |")
    lines += _census_section(report)
    lines += _fidelity_section(report)
    if report.baseline.throughput:
        policy = report.speed_policy
        assert policy is not None  # measured only with validate.throughput
        lines += ["", "## Throughput (samples/s; speedup over baseline)", "",
                  f"Speedup: geometric mean of paired per-round ratios, [{policy.confidence:.0%} confidence "
                  "interval]; spread: fastest vs slowest round of that model; load: 1-minute load average, "
                  "% CPU stolen by the hypervisor, % of all CPUs busy while that batch size was measured.", "",
                  "| model | provider | batch | samples/s | speedup | rounds | spread | p50 ms | p99 ms "
                  "| load / steal / busy |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        rows = [("baseline", m, speedup_text({"speedup": 1.0})) for m in report.baseline.throughput]
        rows += [(n, m, speedup_text(m)) for n, c in report.candidates.items() for m in c.throughput]
        for name, m, speedup in rows:
            load = m.load.model_dump() if m.load else {}
            shown = " / ".join("—" if load.get(k) is None else f"{load[k]:g}{'%' if k != 'load_1m' else ''}"
                               for k in ("load_1m", "steal_pct", "busy_pct"))
            spread = "—" if m.spread_pct is None else f"{m.spread_pct:.1f}%"
            lines.append(f"| {name} | {m.provider} | {m.batch_size} | {m.samples_per_s:,.0f} | "
                         f"{speedup} | {m.rounds} | {spread} | {m.latency_ms.p50:.3f} | "
                         f"{m.latency_ms.p99:.3f} | {shown} |")
    lines += _session_section(report)
    for name in report.searches:
        lines += _search_section(name, report)
    for name, c in report.candidates.items():
        if c.tuning:
            lines += _tuning_section(name, c.tuning)
    failures = [(n, g) for n, c in report.candidates.items() for g in c.gates if not g.passed]
    if failures:
        lines += ["", "## Failed gates", ""] + [f"- `{n}` {g.name}: {g.detail}" for n, g in failures]
    return "\n".join(lines) + "\n"


RANKING_ROWS = 15  # the table; tuning.json holds the whole ranking



def _host_lines(report: Report) -> list[str]:
    """Where every figure below was measured, and what quantize's `preset: auto` made of it."""
    host = report.host
    features = ", ".join(host.features) if host.features_known else "unknown (the OS lists none)"
    gpus = ", ".join(g.name + (f" (compute capability {g.compute_capability})" if g.compute_capability else "")
                     for g in host.gpus) or "none"
    memory = f"{host.memory_gib:g} GiB" if host.memory_gib else "unknown"
    lines = ["## Host", "",
             f"- CPU: {host.cpu} ({host.arch}); INT8/FP16 features: {features}",
             f"- cores used: {host.usable_cores} (of {host.logical_cpus} logical CPUs); memory {memory}; GPU: {gpus}",
             f"- onnxruntime {host.onnxruntime} with {', '.join(host.providers)}",
             *([f"- openvino {host.openvino}"] if host.openvino else []),
             *([f"- NVIDIA stack: {host.gpu_stack().removeprefix(', ')}"] if host.gpu_stack() else [])]
    target = report.target
    if target:
        lines.append(f"- quantize `preset: auto` → `{target.preset or 'none (ONNX Runtime defaults)'}` "
                     f"for target `{target.target}`: {target.reason}")
        used = sorted({(n, c.precision) for n, c in report.candidates.items() if c.precision})
        if target.target != "host" and any(p.startswith("int8") for _, p in used):
            lines.append("- speed was measured on this host, not on the target: re-run the gates there before trusting "
                         "the speedups")
    return lines


def _disagreement_lines(report: Report) -> list[str]:
    """One line per model file whose outputs on two engines miss the fidelity budget against each other."""
    from temper.validators.engine_agreement import describe

    lines = [f"- **engines disagree**: {describe(found)}" for found in report.engine_disagreements]
    if lines:
        lines.append("- the numbers above are the engine's as much as the model's: gate and serve that file on the "
                     "engine it was certified on (NNCF's ONNX-path INT8 can compute differently on OpenVINO than "
                     "on ONNX Runtime: docs/recipes.md)")
    return [*lines, ""] if lines else []


def _not_built_lines(report: Report) -> list[str]:
    """One line per candidate that did not build, before anything else: a build error is not a gate."""
    lines = []
    for name, failure in report.not_built.items():
        what = ("**build error** (not a gate: the run exits 1 unless --allow-build-errors)"
                if failure.kind == "error" else "rejected by its step (its build gate fails)")
        lines.append(f"- `{name}` did not build, {what}: {failure.reason}")
    return [*lines, ""] if lines else []


def _census_section(report: Report) -> list[str]:
    """What each built graph really computes in (validators/census.py), beside what the recipe asked for."""
    rows = [(n, c) for n, c in report.candidates.items() if c.census is not None]
    if not rows:
        return []
    lines = ["", "## Graph census (eligible compute nodes: Conv, ConvTranspose, MatMul, Gemm, Attention, LSTM)", "",
             "| candidate | precision (graph) | asked | eligible | quantized | INT8 on ONNX Runtime | fp16 | fp32 | "
             "in subgraphs | by op |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, c in rows:
        n = c.census
        assert n is not None
        by_op = ", ".join(f"{op} {k.quantized}/{k.fp16}/{k.fp32}" for op, k in n.by_op.items()) or "—"
        asked = c.intended_precision or "—"
        if c.intended_precision and c.intended_precision != c.precision:
            asked = f"**{asked}**"
        runs = "—" if c.engine_census is None else str(c.engine_census.quantized)
        if c.engine_census is not None and c.engine_census.quantized < n.quantized:
            runs = f"**{runs}**"
        lines.append(f"| {name} | {c.precision} | {asked} | {n.eligible} | {n.quantized} | {runs} | {n.fp16} | "
                     f"{n.fp32} | {n.in_subgraphs} | {by_op} |")
    lines += ["", "By op: quantized/fp16/fp32. A graph that is not what its steps asked for fails the precision gate. "
              "INT8 on ONNX Runtime: of a CPU pair's quantized graph, the compute nodes ONNX Runtime fuses into INT8 "
              "kernels; the rest it runs in float on dequantized values."]
    return lines


def _fidelity_section(report: Report) -> list[str]:
    """Every candidate's agreement with the baseline, per output and per recipe slice, whether or not a
    gate failed on it."""
    rows = [(n, f) for n, c in report.candidates.items() for f in c.fidelity]
    if not rows:
        return []
    lines = ["", "## Fidelity (per output, vs the baseline)", "",
             "| candidate | output | cosine | worst row | rel L2 | max abs | mean abs | p99 abs | NaN/Inf |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, f in rows:
        part = f.slice
        where = f.name if part is None else f"{f.name}: {part.output}[axis {part.axis}: {part.start}:{part.stop}]"
        row = f.worst_row
        worst = "—" if row is None else f"{row.cosine:.6f} (index {row.index} of {row.rows})"
        lines.append(f"| {name} | {where} | {f.cosine:.6f} | {worst} | {f.rel_l2:.4g} | {f.max_abs:.4g} | "
                     f"{f.mean_abs:.4g} | {f.p99_abs:.4g} | {f.nonfinite} |")
    return [*lines, "", "Worst row: of an output's leading non-batch axis (when it has at most 256 indices), the index "
                        "whose cosine to the baseline is lowest; gated on row_cosine_min (default cosine_min), so "
                        "box pixels cannot hide broken class scores."]


def _session_section(report: Report) -> list[str]:
    """validate.throughput.session_search: each model's rows against its default settings, and what was kept."""
    if not report.session_searches:
        return []
    lines = ["", "## Session settings", "",
             "Each setting timed against the default in paired rounds (speedup [interval] by batch size); kept "
             "only when faster on its interval at the largest batch size and slower at none.", "",
             "| model | provider | setting | changes | verdict | speedup by batch |", "|---|---|---|---|---|---|"]
    for name, searches in report.session_searches.items():
        for search in searches:
            took = f"search took {search.seconds:.1f} s of {search.budget_s:g} s" + (
                " (cached: reused)" if search.cached else "")
            if search.cut_short:
                took += (f"; the budget cut the rounds short at batch {', '.join(map(str, search.cut_short))}: "
                         f"raise session_search_s to about {search.enough_s:g}")
            lines.append(f"| {name} | {search.provider} | default | — | "
                         f"{'kept' if search.kept == 'default' else '—'} | {took} |")
            for trial in search.trials:
                ups = "; ".join(f"b{u.batch_size} {u.speedup:.2f}x" + (
                    f" [{u.interval[0]:.2f}, {u.interval[1]:.2f}]" if u.interval else "") for u in trial.speedups)
                changes = ", ".join(f"{k}: {v}" for k, v in trial.changes.items())
                lines.append(f"| {name} | {search.provider} | {trial.name} | {changes} | {trial.verdict} | {ups} |")
    return lines


def _search_section(name: str, report: Report) -> list[str]:
    search = report.searches[name]
    lines = ["", f"## Search: {name} ({len(search.trials)} of {search.combinations} combinations built)", "",
             "| trial | verdict | drop | samples/s (largest batch) |", "|---|---|---|---|"]
    for trial in search.trials:
        c = report.candidates[trial]
        speed = max(c.throughput, key=lambda m: m.batch_size).samples_per_s if c.throughput else None
        lines.append(f"| {trial} | {'pass' if c.passed else 'FAIL'} | "
                     f"{'—' if c.drop is None else format(c.drop, '+.4f')} | "
                     f"{'—' if speed is None else format(speed, ',.0f')} |")
    if search.combinations > len(search.trials):
        lines += ["", f"{search.combinations - len(search.trials)} combinations not built: "
                      "raise max_trials to try them."]
    return lines


def _tuning_section(name: str, tuning: Tuning) -> list[str]:
    outcome = "met" if tuning.met else "**not met**: the best model found is kept (the smallest drop)"
    lines = ["", f"## Fallback: {name}", "",
             f"Budget: {tuning.metric} drop at most {tuning.allowed_drop:.4f} from {tuning.baseline_metric:.4f}; "
             f"{outcome}; {tuning.trials_text()}; kept: trial {tuning.best}"
             + ("." if tuning.met else f"; stopped: {tuning.stopped()}."), "",
             f"Floor: every trial keeps at least {tuning.floor} quantized nodes ({tuning.min_quantized:g} of the plain "
             "model's)" + ("; the search reached it, so the budget is **not reachable in INT8** beyond it."
                           if tuning.floor_reached and not tuning.met else "."), "",
             *_configuration_lines(tuning),
             "| trial | kind | nodes in float | quantized nodes | metric | drop | cosine | samples/s | gates |",
             "|---|---|---|---|---|---|---|---|---|"]
    for index, t in enumerate(tuning.trials):
        speed = "—" if t.samples_per_s is None else f"{t.samples_per_s:,.0f}"
        lines.append(f"| {index}{' (kept)' if index == tuning.best else ''} | {t.kind} | {len(t.float_nodes)} | "
                     f"{t.quantized} | {t.metric:.4f} | {t.drop:+.4f} | {t.cosine:.4f} | {speed} | "
                     f"{'held' if t.passed else 'missed'} |")
    kept = tuning.trials[tuning.best].float_nodes
    if kept:
        lines += ["", "Kept in float: " + ", ".join(f"`{n}`" for n in kept)]
    if tuning.ranking:
        lines += ["", "Sensitivity (most harmful first; SQNR of the quantized tensors a node touches, dB; "
                      "-200 = NaN/Inf where the float model has numbers):", "",
                  "| rank | node | op | SQNR dB | output SQNR vs float dB |", "|---|---|---|---|---|"]
        for rank, r in enumerate(tuning.ranking[:RANKING_ROWS], 1):
            acc = "—" if r.accumulated_db is None else f"{r.accumulated_db:.1f}"
            lines.append(f"| {rank} | `{r.node}` | {r.op_type} | {r.sqnr_db:.1f} | {acc} |")
    return lines


def _configuration_lines(tuning: Tuning) -> list[str]:
    """The configurations tried before any node went float, and the one the node search started from."""
    if not tuning.configurations:
        return []

    def shown(changes: dict[str, object]) -> str:
        return ", ".join(f"{k}: {v}" for k, v in changes.items()) or "the step's own"

    lines = ["Configurations tried before any node went float (plain model each):", "",
             "| configuration | quantized nodes | metric | drop | cosine | gates |", "|---|---|---|---|---|---|"]
    lines += [f"| {shown(c.changes)} | {c.quantized} | {c.metric:.4f} | {c.drop:+.4f} | {c.cosine:.4f} | "
              f"{'held' if c.passed else 'missed'} |"
              if c.error is None else f"| {shown(c.changes)} | - | - | - | - | skipped: {c.error} |"
              for c in tuning.configurations]
    return [*lines, "", f"The node search started from: {shown(tuning.configuration)}.", ""]


def junit(report: Readable) -> ET.ElementTree:
    """One test case per candidate gate, so a CI system shows exactly which gate failed."""
    report = Report.model_validate(report)
    cases = [(name, gate) for name, c in report.candidates.items() for gate in c.gates]

    def raised(name: str, gate: Any) -> bool:  # a build error is a JUnit error, not a failed check
        return gate.kind == "build" and name in report.not_built and report.not_built[name].kind == "error"

    errors = sum(not g.passed and raised(n, g) for n, g in cases)
    failures = sum(not g.passed for _, g in cases) - errors
    suite = ET.Element("testsuite", name=f"temper.{report.recipe}", tests=str(len(cases)),
                       failures=str(failures), errors=str(errors), skipped="0")
    for name, gate in cases:
        case = ET.SubElement(suite, "testcase", classname=f"{report.recipe}.{name}", name=gate.name)
        if not gate.passed:
            kind = "error" if raised(name, gate) else "failure"
            ET.SubElement(case, kind, message=gate.detail, type="build" if kind == "error" else "gate"
                          ).text = json.dumps(gate.model_dump())
    root = ET.Element("testsuites", tests=str(len(cases)), failures=str(failures), errors=str(errors))
    root.append(suite)
    return ET.ElementTree(root)
