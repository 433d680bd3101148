"""The `temper` command line. Errors are one line and an exit code (2 bad input, 3 environment,
1 a step or candidate failed); `--debug` shows the traceback instead.

Without ONNX Runtime (a bare `pip install temper-ml`) every command is one line and exit 3
(pipeline/cli/runtime_check.py), checked here before the commands' modules import it.

The commands live in modules by audience (`build`: recipes to gated models; `deploy`: published
models to servers; `measure`: bench); each only parses and prints, the work is in `pipeline.flow` and below.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import signal
import sys
from types import FrameType
from typing import Annotated

import typer
from rich.text import Text
from typer._click.exceptions import NoArgsIsHelpError  # typer bundles click: `click`'s own classes never match

from temper.artifacts.core import native_logs
from temper.artifacts.core.errors import Interrupted, TemperError, reraise_interrupt
from temper.pipeline.cli import runtime_check

IMPORT_POLL_S = 0.05  # an interrupt that came during an import is delivered this long after, or later

runtime_check.exit_without_runtime()  # before the commands' modules import onnxruntime

from temper.pipeline.cli import build, deploy, ensemble, measure  # noqa: E402, F401  (each registers its commands)
from temper.pipeline.cli.common import Invocation, app, err, shown  # noqa: E402

__all__ = ["app", "main"]


def _show_version(value: bool) -> None:
    """`temper --version`: the installed temper-ml distribution's version, before any command runs."""
    if value:
        print(f"temper {importlib.metadata.version('temper-ml')}")
        raise typer.Exit()


@app.callback()
def _options(
    ctx: typer.Context,
    debug: Annotated[bool, typer.Option("--debug", help="show tracebacks and library warnings")] = False,
    version: Annotated[bool, typer.Option("--version", help="print the version and exit", is_eager=True,
                                          callback=_show_version)] = False,
) -> None:
    invocation: Invocation = ctx.ensure_object(Invocation)
    invocation.debug, invocation.command = debug, ctx.invoked_subcommand
    # Exporters, quantizers and MLflow log and warn advice meant for their own developers; temper reports what
    # matters. Without --debug warnings become log records below the root level: a library's own "once" or
    # "always" filter cannot bring them back.
    logging.captureWarnings(not debug)
    logging.getLogger().setLevel(logging.DEBUG if debug else logging.ERROR)
    # MLflow sets its loggers' levels when it is imported (lazily, after this) from this variable; the
    # setLevel calls cover an MLflow imported already (the tests call main() in-process).
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "DEBUG" if debug else "ERROR")
    for chatty in ("mlflow", "alembic"):
        logging.getLogger(chatty).setLevel(logging.DEBUG if debug else logging.ERROR)
    # ONNX Runtime's `[E:onnxruntime]` lines and onnx-simplifier's C++ warnings repeat, on stderr, the one line
    # temper prints (or say nothing to act on): only --debug shows them
    native_logs.quiet(not debug)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    """Raise Interrupted where the main thread is, or, inside an import, once it is out of it (polled): torch's C++
    imports modules through pybind11, where an exception raised by a handler aborts the process (`terminate
    called`), exit 134 with the output folder's partial copies left behind."""
    if _importing(frame):
        signal.signal(signal.SIGALRM, lambda _, later: _interrupt(signum, later))
        signal.setitimer(signal.ITIMER_REAL, IMPORT_POLL_S)
        return
    raise Interrupted(signum)


def _importing(frame: FrameType | None) -> bool:
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib._bootstrap"):
            return True
        frame = frame.f_back
    return False


def main() -> None:
    """Run the CLI with temper's exit codes: usage errors and bad input 2, environment 3, interrupts 128 + signal."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # recipes load local models; never reach for a hub
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # temper shows its own progress
    previous = {each: signal.signal(each, _interrupt) for each in (signal.SIGINT, signal.SIGTERM)
                if signal.getsignal(each) is not signal.SIG_IGN}  # ignored by the parent (`nohup`, `cmd &`): stays so
    invocation = Invocation()
    try:
        try:
            code = app(standalone_mode=False, obj=invocation)  # returns the code of a typer.Exit raised by a command
        except Exception as exc:  # an interrupt a library turned into an error of its own is still the interrupt
            reraise_interrupt(exc)
            raise
    except Interrupted as exc:
        if invocation.command == "serve":  # how a server is stopped: it drained and shut down, a normal end
            err.print("stopped")
            sys.exit(0)
        if invocation.command != "run":
            err.print("interrupted")
        elif invocation.committed:
            err.print(Text(f"interrupted after writing {shown(invocation.committed[-1])}"), soft_wrap=True)
        else:
            err.print("interrupted: nothing was written to the output folder")
        sys.exit(128 + exc.signum)
    except TemperError as exc:
        if invocation.debug:
            raise
        err.print(Text.assemble(("error: ", "red"), str(exc)), soft_wrap=True)
        sys.exit(exc.exit_code)
    except NoArgsIsHelpError as exc:  # bare `temper`: the help, as the usage error it is
        exc.show()
        sys.exit(2)
    except typer.TyperException as exc:  # typer's own copy of click's errors: an unknown option, a bad value...
        ctx = getattr(exc, "ctx", None)
        hint = f" (see {ctx.command_path} --help)" if ctx is not None else ""
        err.print(Text.assemble(("error: ", "red"), " ".join(exc.format_message().split()) + hint), soft_wrap=True)
        sys.exit(2)
    finally:
        for each, handler in previous.items():
            signal.signal(each, handler)
    sys.exit(code if isinstance(code, int) else 0)
