"""The `temper` command line. Errors are one line and an exit code (2 bad input, 3 environment,
1 a step or candidate failed); `--debug` shows the traceback instead."""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import click
import typer
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from pipeline.cache import StepCache, default_root
from pipeline.errors import TemperError
from pipeline.loading import load_recipe
from pipeline.recipe import Recipe
from pipeline.runner import ModelRecord, RunResult, Runner

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Recipes in, optimized and gated ONNX models out.")
out = Console()
err = Console(stderr=True)
DEBUG = {"on": False}

RecipeArg = Annotated[Path, typer.Argument(help="recipe YAML file", show_default=False)]
CacheOpt = Annotated[Optional[Path], typer.Option("--cache-dir", help="step cache (default: $TEMPER_CACHE_DIR or ~/.cache/temper)")]


@app.callback()
def _options(debug: Annotated[bool, typer.Option("--debug", help="show tracebacks and library warnings")] = False) -> None:
    DEBUG["on"] = debug
    # Exporters and quantizers log advice meant for their own developers; temper reports what matters.
    logging.getLogger().setLevel(logging.DEBUG if debug else logging.ERROR)


class _Display:
    """Observer that shows the running step (candidate, step, elapsed) and logs each finished one."""

    def __init__(self, progress: Progress) -> None:
        self.progress, self.task = progress, None

    def started(self, chain: str, step: str) -> None:
        if self.task is not None:
            self.progress.remove_task(self.task)
        self.task = self.progress.add_task(f"{chain} › {step}", total=None)

    def finished(self, chain: str, record: ModelRecord) -> None:
        note = "cached" if record.cached else f"{record.seconds:.1f}s"
        self.progress.console.print(f"  [green]✓[/] {chain} › {record.step}  [dim]{note}[/]")


@app.command()
def run(
    recipe: RecipeArg,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="output folder (default: out/<recipe name>)")] = None,
    cache_dir: CacheOpt = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="rebuild every step (results still refresh the cache)")] = False,
) -> None:
    """Build the baseline and every candidate; write models and manifest.json to the output folder."""
    from pipeline.outputs import OutputFolder

    loaded = load_recipe(recipe)
    folder = OutputFolder(output or Path("out") / loaded.recipe.name)
    runner = Runner(loaded, StepCache(cache_dir or default_root(), enabled=not no_cache))
    begin = time.perf_counter()
    try:
        with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=err, transient=True) as progress:
            runner.observer = _Display(progress)
            result = runner.run()
        target = folder.commit(loaded, result)
    finally:
        folder.discard()
        runner.close()
    out.print(_summary(result))
    out.print(f"wrote {_shown(target)} in {time.perf_counter() - begin:.1f}s")
    failed = [c for c in result.candidates if c.error]
    for c in failed:
        err.print(Text.assemble(("error: ", "red"), f"candidate {c.name}: {c.error}"), soft_wrap=True)
    if failed:
        raise typer.Exit(1)


@app.command()
def check(recipe: RecipeArg, cache_dir: CacheOpt = None) -> None:
    """Validate the recipe and everything it refers to, without building candidates."""
    from pipeline.check import check as run_check

    loaded = load_recipe(recipe)
    runner = Runner(loaded, StepCache(cache_dir or default_root()))
    try:
        for line in run_check(runner):
            out.print(Text.assemble(("  ✓ ", "green"), line))
    finally:
        runner.close()
    out.print(f"{recipe}: ok")


@app.command()
def schema() -> None:
    """Print the recipe JSON Schema (for editor completion and validation)."""
    print(json.dumps(Recipe.model_json_schema(), indent=2))


def _summary(result: RunResult) -> Table:
    table = Table(title="temper run", title_justify="left")
    for col, justify in (("model", "left"), ("status", "left"), ("size", "right"), ("steps (time)", "left"), ("total", "right")):
        table.add_column(col, justify=justify)
    rows = [("baseline", result.baseline, None)]
    rows += [(c.name, c.records, c.error) for c in result.candidates]
    for name, records, error in rows:
        steps = ", ".join(f"{r.step} {r.seconds:.1f}s{'*' if r.cached else ''}" for r in records)
        size = f"{records[-1].bytes / 1024:,.0f} KiB" if records and not error else "-"
        status = "[red]failed[/]" if error else "ok"
        table.add_row(name, status, size, steps, f"{sum(r.seconds for r in records):.1f}s")
    table.caption = "* cached: time of the original build"
    return table


def _shown(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def main() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # recipes load local models; never reach for a hub
    try:
        code = app(standalone_mode=False)  # returns the code of a typer.Exit raised by a command
    except TemperError as exc:
        if DEBUG["on"]:
            raise
        err.print(Text.assemble(("error: ", "red"), str(exc)), soft_wrap=True)
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(2)
    except click.exceptions.Abort:
        err.print("interrupted")
        sys.exit(130)
    except KeyboardInterrupt:
        err.print("interrupted: nothing was written to the output folder")
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)
