"""What every temper command shares: the typer app, the consoles, the common options, progress display."""

from __future__ import annotations

import datetime
import functools
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.text import Text

from temper.artifacts.core import native_logs
from temper.artifacts.core.errors import unwritable
from temper.artifacts.core.folders import require_writable
from temper.artifacts.core.versions import require_one_runtime
from temper.pipeline.cache import StepCache, default_root
from temper.pipeline.runner import ModelRecord

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Recipes in, optimized and gated ONNX models out.")
out = Console()
err = Console(stderr=True)


@dataclass
class Invocation:
    """What one `temper` invocation knows about itself, handed to the commands as typer's ctx.obj:
    main() creates it and reads it back for the line an error or interruption ends with."""

    debug: bool = False  # --debug: tracebacks instead of one line
    command: str | None = None  # the subcommand running
    committed: list[Path] = field(default_factory=list)  # output folders `run` put in place


Command = TypeVar("Command", bound=Callable[..., Any])


def opens_sessions(command: Command) -> Command:
    """Mark a command that opens ONNX Runtime sessions: before its body runs (its arguments already parsed, so
    --help and a bad flag answer as usual), it refuses, once, an environment without exactly one ONNX Runtime
    distribution (both onnxruntime and onnxruntime-gpu installed: exit 3, one line naming the fix).
    tests/pipeline/test_runtime_install.py checks that every command but those in SESSIONLESS carries it."""
    @functools.wraps(command)
    def checked(*args: Any, **kwargs: Any) -> Any:
        require_one_runtime()
        native_logs.apply()  # the libraries' sessions log as the command line chose (--debug or not)
        return command(*args, **kwargs)

    checked.opens_sessions = True  # type: ignore[attr-defined]
    return checked  # type: ignore[return-value]


# registry moves, downloads, config files: no session
SESSIONLESS = ("promote", "pull", "export-triton", "export-ensemble", "schema")


def folder(text: str) -> Path:
    """A folder flag's value: an empty one is refused, a usage error naming the flag (Path("") is the working
    folder: `--dest ""` wrote there, as if it had been asked)."""
    if not text.strip():
        raise typer.BadParameter("is empty: name a folder ('.' for the working folder)")
    return Path(text)


def folder_option(*flags: str, **options: Any) -> Any:
    """A folder flag's typer.Option: its value through `folder` (an empty one refused), shown as <path>."""
    return typer.Option(*flags, parser=folder, metavar="<path>", **options)


def absolute(path: Path | None) -> Path | None:
    """A user's path made absolute once, where it enters: steps run libraries inside other working
    folders (static quantization chdirs into its scratch folder), so nothing below may read the cwd."""
    return None if path is None else path.expanduser().resolve()


def absolute_store(uri: str | None) -> str | None:
    """--tracking-uri, else $MLFLOW_TRACKING_URI, with a relative local store (sqlite:///mlflow.db,
    ./mlruns, file:mlruns) made absolute; servers (http://, databricks) pass as they are. None: the
    registry's default, an mlflow.db it places in the working folder itself."""
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI") or None
    if uri is None:
        return None
    if uri.startswith("sqlite:///"):
        db = uri.removeprefix("sqlite:///")
        return uri if db in ("", ":memory:") or db.startswith("/") else f"sqlite:///{Path(db).expanduser().resolve()}"
    if uri.startswith("file:") and not uri.startswith("file://"):
        return Path(uri.removeprefix("file:")).expanduser().resolve().as_uri()
    if "://" not in uri and uri not in ("databricks", "databricks-uc", "uc"):  # a bare folder: MLflow's file store
        return Path(uri).expanduser().resolve().as_uri()
    return uri


def number(flag: str, help: str, low: float, high: float | None = None, *, above: bool = False) -> Any:
    """A numeric flag's typer.Option: finite and at least `low` (more than it with `above`) and at most `high`
    (no ceiling when None). Every numeric flag is made here, so all refuse alike: `inf` or `nan` would loop
    forever or reach int() as a traceback, and a value out of range is a typo, not a setting to replace
    quietly. A refusal is a usage error: one line naming the flag, exit 2."""
    span = f"{'more than' if above else 'at least'} {_plain(low)}"
    span += "" if high is None else f" and at most {_plain(high)}"

    def check(value: float | None) -> float | None:
        if value is None:  # an optional flag not given
            return None
        if not (math.isfinite(value) and (value > low if above else value >= low) and (high is None or value <= high)):
            what = "a finite number " if isinstance(value, float) else ""
            raise typer.BadParameter(f"must be {what}{span}, got {value!r}")
        return value

    return typer.Option(flag, callback=check, help=f"{help} ({span})")


def _plain(bound: float) -> str:
    return f"{bound:g}" if isinstance(bound, float) else str(bound)  # 0.001, 2047, 2147483647


RecipeArg = Annotated[Path, typer.Argument(help="recipe YAML file", show_default=False)]
CacheOpt = Annotated[Path | None, folder_option(
    "--cache-dir", callback=absolute,
    help="step cache (default: $TEMPER_CACHE_DIR, else the user cache folder, e.g. ~/.cache/temper)")]
TrackingOpt = Annotated[str | None, typer.Option(
    "--tracking-uri", callback=absolute_store,
    help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db here)")]
OutputOpt = Annotated[Path | None, folder_option(
    "--output", "-o", callback=absolute, help="output folder (default: out/<recipe name>)")]
RequireOpt = Annotated[list[str] | None, typer.Option(
    "--require", help="exit 1 unless this candidate passed every gate (repeatable)")]


def step_cache(folder: Path | None, enabled: bool = True) -> StepCache:
    """The cache at --cache-dir, else $TEMPER_CACHE_DIR, else the user cache folder; always absolute, and a
    folder this user can write (made now if need be), so a file in its place or a read-only one is one line
    naming where it came from before anything is built, not a traceback from the first step that stores."""
    root = absolute(folder) or default_root()
    # what chose it; the user cache folder is named by the flag that picks another
    key = "TEMPER_CACHE_DIR" if folder is None and os.environ.get("TEMPER_CACHE_DIR") else "--cache-dir"
    try:
        root.mkdir(parents=True, exist_ok=True)
        require_writable(root)
    except OSError as exc:
        raise unwritable(root, key, exc, "the step cache") from exc
    return StepCache(root, enabled=enabled)


class Display:
    """Observer that shows the running step (candidate, step, elapsed) and logs each finished one. On a terminal
    what runs now is one transient line; where stderr is not one (a CI log) that line never shows, so each
    finished piece of a long phase (a fallback trial, a pair timed at a batch size) is a line of its own, with
    the time since the command began."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.task: TaskID | None = None
        self.began = time.perf_counter()

    def started(self, chain: str, step: str) -> None:
        if self.task is not None:
            self.progress.remove_task(self.task)
        self.task = self.progress.add_task(f"{chain} › {step}", total=None)

    def note(self, text: str) -> None:
        if self.task is not None:
            self.progress.remove_task(self.task)
        self.task = self.progress.add_task(text, total=None)

    def finished(self, chain: str, record: ModelRecord) -> None:
        note = "cached" if record.cached else f"{record.seconds:.1f}s"
        self.progress.console.print(f"  [green]✓[/] {chain} › {record.step}  [dim]{note}[/]")

    def logged(self, text: str) -> None:
        if self.progress.console.is_terminal:
            self.note(text)
            return
        elapsed = datetime.timedelta(seconds=int(time.perf_counter() - self.began))
        self.progress.console.print(Text.assemble("  · ", text, (f"  {elapsed}", "dim")), soft_wrap=True)



def progress() -> Progress:
    return Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=err, transient=True)


def shown(path: Path) -> str:
    """A path as the user would type it: relative to the working folder when it is inside it."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)
