"""`temper run` on a decoder recipe (`kind: decoder`): build, gate, select for the workload, print the gates and
the reason; the decisions are in pipeline/decoders/flow.py."""

from __future__ import annotations

import time
from pathlib import Path

from rich.table import Table

from temper.pipeline.cli.common import err, out, shown, step_cache
from temper.pipeline.decoders import flow
from temper.pipeline.decoders.loading import load_decoder
from temper.validators.decoder_report import DecoderReport


def _table(report: DecoderReport) -> Table:
    table = Table(title=f"{report.recipe}: {report.workload} workload", title_justify="left")
    for column in ("model", "ppl", "ΔNLL (upper)", "agree", "KL", "TTFT ms", "tok/s", "gates"):
        table.add_column(column, overflow="fold")
    base = report.baseline
    assert base.speed is not None
    table.add_row("baseline", f"{report.baseline_perplexity:.3f}", "", "", "",
                  f"{base.speed.ttft_ms:.1f}", f"{base.speed.decode_tokens_per_s:.1f}", "")
    for name, model in report.candidates.items():
        q, s = model.quality, model.speed
        interval = q.nll_delta_interval if q else None
        table.add_row(
            name,
            f"{q.perplexity:.3f}" if q else "",
            (f"{q.nll_delta:+.4f}" + (f" ({interval[1]:+.4f})" if interval else "")) if q else "",
            f"{q.agreement:.3f}" if q else "", f"{q.kl:.4f}" if q else "",
            f"{s.ttft_ms:.1f}" if s else "-", f"{s.decode_tokens_per_s:.1f}" if s else "-",
            "pass" if model.passed else "FAIL: " + ", ".join(g.name for g in model.gates if not g.passed))
    return table


def run_decoder(recipe: Path, output: Path | None, cache_dir: Path | None, no_cache: bool,
                require: list[str] | None, allow_build_errors: bool) -> int:
    loaded = load_decoder(recipe)
    begin = time.perf_counter()
    target = (output or Path("out") / loaded.recipe.name).resolve()
    outcome = flow.run(loaded, target, step_cache(cache_dir).root, use_cache=not no_cache, require=require,
                       allow_build_errors=allow_build_errors, progress=lambda line: err.print(f"› {line}"))
    report = outcome.report
    out.print(_table(report))
    for name, why in report.not_built.items():
        err.print(f"[red]not built[/red] {name}: {why}", soft_wrap=True)
    if report.export is not None:
        e = report.export
        verdict = "pass" if e.passed else "FAIL: " + ", ".join(g.name for g in e.gates if not g.passed)
        out.print(f"baseline vs {e.source}: perplexity {report.baseline_perplexity:.3f} vs {e.source_perplexity:.3f}, "
                  f"ΔNLL {e.nll_delta:+.4f}, agreement {e.agreement:.3f}: {verdict}", soft_wrap=True)
    out.print(f"decode path: {report.speed_setup.decode_path}", soft_wrap=True)
    out.print(f"selected: {report.selected} — {report.selection_reason}", soft_wrap=True)
    out.print(f"wrote {shown(outcome.folder)} in {time.perf_counter() - begin:.1f}s")
    for name in outcome.missed:
        err.print(f"--require {name}: did not pass")
    return outcome.exit_code
