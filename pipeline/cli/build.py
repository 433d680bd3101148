"""Commands that build and gate models from a recipe: run, validate, check, sensitivity, schema.

They parse, call `pipeline.flow` (or the check/ranking functions) and print; the decisions are there.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table
from rich.text import Text

from temper.pipeline import flow
from temper.pipeline.cache import StepCache
from temper.pipeline.cli.common import (
    CacheOpt,
    Display,
    Invocation,
    OutputOpt,
    RecipeArg,
    RequireOpt,
    TrackingOpt,
    absolute,
    app,
    err,
    folder_option,
    number,
    opens_sessions,
    out,
    progress,
    shown,
    step_cache,
)
from temper.pipeline.decoders.loading import is_decoder
from temper.pipeline.loading import LoadedRecipe, load_recipe
from temper.pipeline.runner import ModelRecord, Runner, RunResult

if TYPE_CHECKING:
    from rich.console import JustifyMethod as Justify

    from temper.validators.report_model import Report


AllowBuildErrorsOpt = Annotated[bool, typer.Option(
    "--allow-build-errors", help="exit 0 even when a candidate's build raised an error "
                                 "(it is still named in the summary and report.json)")]


@app.command()
@opens_sessions
def run(
    ctx: typer.Context,
    recipe: RecipeArg,
    output: OutputOpt = None,
    cache_dir: CacheOpt = None,
    no_cache: Annotated[bool, typer.Option(
        "--no-cache", help="rebuild every step (results still refresh the cache)")] = False,
    require: RequireOpt = None,
    tracking_uri: TrackingOpt = None,
    allow_build_errors: AllowBuildErrorsOpt = False,
) -> None:
    """Build the baseline and every candidate, validate them against the recipe's gates, write the output
    folder, and publish the selected candidate when the recipe has a publish section and the gates hold."""
    if is_decoder(recipe):  # `kind: decoder`: a causal LM's own flow (pipeline/decoders/)
        from temper.pipeline.cli.decoder import run_decoder

        raise typer.Exit(run_decoder(recipe, output, cache_dir, no_cache, require, allow_build_errors))
    loaded = load_recipe(recipe)
    begin = time.perf_counter()
    with progress() as shown_progress:
        outcome = flow.run(loaded, output or (Path("out") / loaded.recipe.name).resolve(),
                           step_cache(cache_dir, not no_cache), require=require, tracking=tracking_uri,
                           observer=Display(shown_progress), allow_build_errors=allow_build_errors,
                           committed=ctx.ensure_object(Invocation).committed,
                           notify=lambda line: shown_progress.console.print(notice(line), soft_wrap=True))
    assert outcome.result is not None
    out.print(_summary(outcome.result))
    _print_not_built(outcome)
    seconds = time.perf_counter() - begin
    if outcome.report is None:
        out.print(f"wrote {shown(outcome.folder)} in {seconds:.1f}s (no validate section: nothing gated)")
        raise typer.Exit(outcome.exit_code)
    out.print(f"wrote {shown(outcome.folder)} in {seconds:.1f}s")
    _print_gates(outcome)
    done = flow.publish(loaded, outcome, tracking_uri)
    if done is not None:
        how = (f"reused version {done.version} (same model and recipe)" if done.reused
               else f"registered version {done.version}")
        what = (f"candidate {outcome.report.selected}" if outcome.report.passed
                else "the FP32 baseline: no candidate passed")
        out.print(Text.assemble(("published: ", "green"), f"{done.uri} -> {done.name} {how} ({what})"), soft_wrap=True)
    raise typer.Exit(outcome.exit_code)


@app.command("validate")
@opens_sessions
def validate_cmd(
    recipe: RecipeArg,
    output: Annotated[Path | None, folder_option(
        "--output", "-o", callback=absolute,
        help="folder an earlier `temper run` wrote (default: out/<recipe name>); with --model, the folder to "
             "download the version's run into and re-gate (default: a temporary one)")] = None,
    model: Annotated[str | None, typer.Option(
        "--model", help="re-check a published version instead, models:/NAME@ALIAS or models:/NAME/VERSION: its "
                        "run's models, gated again with the gates it was published with, on this host and "
                        "runtime; exit 1 when its candidate no longer passes")] = None,
    cache_dir: CacheOpt = None,
    require: RequireOpt = None,
    tracking_uri: TrackingOpt = None,
    allow_build_errors: AllowBuildErrorsOpt = False,
) -> None:
    """Re-run validation on an existing output folder (e.g. with new budgets) without rebuilding anything, or
    re-check a published version (--model) on this host and runtime."""
    loaded = load_recipe(recipe)
    if model is not None:
        _recheck(loaded, model, output, step_cache(cache_dir), require, tracking_uri)
    with progress() as shown_progress:
        outcome = flow.revalidate(loaded, (output or Path("out") / loaded.recipe.name).resolve(), step_cache(cache_dir),
                                  require=require, observer=Display(shown_progress),
                                  allow_build_errors=allow_build_errors)
    for name, failure in outcome.report.not_built.items() if outcome.report else ():
        if failure.kind == "error":
            counted = name in outcome.build_errors
            tail = "exit 1; --allow-build-errors accepts it" if counted else "accepted by --allow-build-errors"
            err.print(Text.assemble(("error: ", "red") if counted else ("warning: ", "yellow"),
                                    f"candidate {name} did not build: {failure.reason} (a build error: {tail})"),
                      soft_wrap=True)
    _print_gates(outcome)
    raise typer.Exit(outcome.exit_code)


def _recheck(loaded: LoadedRecipe, model: str, output: Path | None, cache: StepCache, require: list[str] | None,
             tracking: str | None) -> None:
    """`temper validate RECIPE --model URI`: the version's gates again, the gate table, what was compared."""
    with tempfile.TemporaryDirectory(prefix="temper-recheck-") as tmp:
        with progress() as shown_progress:
            done = flow.revalidate_published(loaded, model, output or Path(tmp) / "output", cache, require=require,
                                             tracking=tracking, observer=Display(shown_progress))
        _print_gates(done.outcome)
    moved = [f"{lib} {done.now.get(lib, 'absent')} (gated on {then})" for lib, then in done.gated_with.items()
             if done.now.get(lib) != then]
    verdict = "still passes" if done.candidate not in done.outcome.missed else "no longer passes"
    out.print(Text.assemble(("re-checked: ", "green" if verdict == "still passes" else "red"),
                            f"{done.uri} (candidate {done.candidate}) {verdict} its recorded gates here; "
                            + ("runtime: " + ", ".join(moved) if moved else "same runtime versions as when gated")
                            + (f"; reports in {shown(done.outcome.folder)}" if output else "")), soft_wrap=True)
    raise typer.Exit(done.outcome.exit_code)


@app.command()
@opens_sessions
def check(recipe: RecipeArg, cache_dir: CacheOpt = None, tracking_uri: TrackingOpt = None) -> None:
    """Validate the recipe and everything it refers to, without building candidates."""
    from temper.pipeline.check import check as run_check

    with Runner(load_recipe(recipe), step_cache(cache_dir)) as runner:
        checked = run_check(runner, tracking_uri)
    for line in checked.done:
        out.print(Text.assemble(("  ✓ ", "green"), line))
    for line in checked.notices:
        out.print(notice(line), soft_wrap=True)
    out.print(f"{recipe}: ok")


@app.command()
@opens_sessions
def sensitivity(
    recipe: RecipeArg,
    candidate: Annotated[str, typer.Option("--candidate", help="candidate with a static quantize step")],
    top: Annotated[int, number("--top", "rows to print", 1)] = 20,
    samples: Annotated[int | None, number(
        "--samples", "calibration samples to measure on; default: the step's fallback.samples, else 64", 1)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the whole ranking as JSON on stdout")] = False,
    cache_dir: CacheOpt = None,
) -> None:
    """Rank a candidate's quantized nodes by how much INT8 hurts them (SQNR on calibration data), without tuning."""
    from temper.pipeline.ranking import rank_candidate

    loaded = load_recipe(recipe)
    with progress() as shown_progress, Runner(loaded, step_cache(cache_dir), Display(shown_progress)) as runner:
        ranking = rank_candidate(runner, candidate, samples)
        runner.observer.note("done")
    if as_json:
        print(json.dumps([r.as_dict() for r in ranking], indent=2))
        return
    table = Table(title=f"{candidate}: nodes by INT8 sensitivity (most harmful first)", title_justify="left")
    columns: tuple[tuple[str, Justify], ...] = (("rank", "right"), ("node", "left"), ("op", "left"),
                                                ("SQNR dB", "right"), ("output vs float dB", "right"))
    for col, justify in columns:
        table.add_column(col, justify=justify)
    for index, r in enumerate(ranking[:top], 1):
        table.add_row(str(index), r.node, r.op_type, f"{r.sqnr_db:.1f}",
                      "-" if r.accumulated_db is None else f"{r.accumulated_db:.1f}")
    table.caption = (f"{len(ranking)} quantized nodes; SQNR of the quantized tensors each touches (-200: NaN/Inf where "
                     "the float model has numbers). Keep the top ones in float with exclude_nodes, "
                     "or let fallback: do it.")
    out.print(table)


@app.command()
def schema() -> None:
    """Print the recipe JSON Schema (for editor completion and validation)."""
    from temper.pipeline.schema import recipe_schema

    print(json.dumps(recipe_schema(), indent=2))


def notice(line: str) -> Text:
    """One of `temper check`'s notices as `check` and `run` print it."""
    return Text.assemble(("  ! ", "yellow"), line)


def _print_not_built(outcome: flow.Outcome) -> None:
    """One line per candidate that did not build. In a gated run a build error fails the run (exit 1)
    unless --allow-build-errors; a rejection is a failed build gate. Ungated, every candidate must build."""
    assert outcome.result is not None
    for c in outcome.result.candidates:
        if not c.error:
            continue
        line = f"candidate {c.name} did not build: {c.error}"
        if outcome.report is None:
            err.print(Text.assemble(("error: ", "red"), line), soft_wrap=True)
        elif c.failure == "rejected":
            err.print(Text.assemble(("rejected: ", "yellow"), f"{line} (its build gate fails)"), soft_wrap=True)
        elif c.name in outcome.build_errors:
            err.print(Text.assemble(("error: ", "red"), f"{line} (a build error, not a gate: exit 1; "
                                                        "--allow-build-errors accepts it)"), soft_wrap=True)
        else:
            err.print(Text.assemble(("warning: ", "yellow"), f"{line} (a build error, accepted by "
                                                             "--allow-build-errors)"), soft_wrap=True)


def _print_gates(outcome: flow.Outcome) -> None:
    """The gate table, any fallback that missed its budget, the selection and why, and each required miss."""
    verdict = outcome.report
    assert verdict is not None
    from temper.validators.engine_agreement import describe
    from temper.validators.report import engine_line, int8_shortfall

    out.print(_gate_table(verdict))
    for name, c in verdict.candidates.items():  # what the table's INT8 verdict rests on, beside it
        if (short := int8_shortfall(c)) is not None:
            out.print(Text.assemble(f"{name} ", ("pass", "green") if c.passed else ("FAIL", "red"), f": {short}"),
                      soft_wrap=True)
    for name, c in verdict.candidates.items():
        tuning = c.tuning
        if tuning and not tuning.met:
            best = tuning.trials[tuning.best]
            err.print(Text.assemble(("fallback: ", "red"),
                                    f"{name} missed the budget after {tuning.trials_text(most=False)}: "
                                    f"best {tuning.metric} drop {best.drop:+.4f} (allowed {tuning.allowed_drop:.4f}) "
                                    f"with {len(best.float_nodes)} nodes in float; that model is kept, "
                                    f"every trial is in report.md. Stopped: {tuning.stopped()}."),
                      soft_wrap=True)
    for found in verdict.engine_disagreements:
        err.print(Text.assemble(("engines disagree: ", "yellow"), describe(found)), soft_wrap=True)
    out.print(Text.assemble(("selected: ", "green"), verdict.selected_pair))
    out.print(Text(f"serving: {engine_line(verdict)}"), soft_wrap=True)
    out.print(Text(verdict.selection_reason), soft_wrap=True)  # plain text: gate names hold [brackets]
    for name in outcome.missed:
        err.print(Text.assemble(("gates failed: ", "red"), f"required candidate {name} did not pass"))


def _gate_table(verdict: Report) -> Table:
    from temper.validators.report import speedup_text

    table = Table(title="gates", title_justify="left")
    metric = verdict.metric
    # A `file.py:function` metric is headed by its function (the caption names it whole); that header and
    # the gate names wrap, so a narrow terminal folds them instead of cutting the verdict to `pa…`.
    table.add_column("candidate", no_wrap=True)
    table.add_column("verdict", no_wrap=True)
    table.add_column(metric.rpartition(":")[2] if metric else "metric", overflow="fold")
    table.add_column("drop", no_wrap=True)
    table.add_column("speedup")
    table.add_column("failed gates", overflow="fold")
    for name, c in verdict.candidates.items():
        largest = max(c.throughput, key=lambda m: m.batch_size) if c.throughput else None
        table.add_row(
            name, "[green]pass[/]" if c.passed else "[red]FAIL[/]",
            f"{c.metric:.4f}" if c.metric is not None else "-",
            f"{c.drop:+.4f}" if c.drop is not None else "-",
            Text(speedup_text(largest)) if largest else "-",
            Text("\n".join(g.name for g in c.gates if not g.passed) or "-"),
        )
    if metric:
        table.caption = (f"baseline {metric} {verdict.baseline.metric:.4f}, allowed drop "
                         f"{verdict.allowed_drop:.4f}; speedup at the largest batch size with its confidence interval; "
                         f"measured on {verdict.host.summary()}; details in report.md")
    return table


def _summary(result: RunResult) -> Table:
    table = Table(title="temper run", title_justify="left")
    columns: tuple[tuple[str, Justify], ...] = (("model", "left"), ("status", "left"), ("size", "right"),
                                                ("steps (time)", "left"), ("total", "right"))
    for col, justify in columns:
        table.add_column(col, justify=justify)
    rows: list[tuple[str, list[ModelRecord], str | None]] = [("baseline", result.baseline, None)]
    rows += [(c.name, c.records, c.error and (c.failure or "error")) for c in result.candidates]
    for name, records, failure in rows:
        steps = ", ".join(f"{r.step} {r.seconds:.1f}s{'*' if r.cached else ''}" for r in records)
        size = f"{records[-1].bytes / 1024:,.0f} KiB" if records and not failure else "-"
        status = {"error": "[red]build error[/]", "rejected": "[yellow]rejected[/]"}.get(failure or "", "ok")
        table.add_row(name, status, size, steps, f"{sum(r.seconds for r in records):.1f}s")
    table.caption = "* cached: time of the original build"
    return table
