"""Every way temper fails on purpose, in one place every layer may import.

Run errors end a command with a chosen exit code and one line of text, no traceback (TemperError
and its subclasses). Request errors say why the serving runtime did not answer one request; the
batcher, the REST server and the gRPC server each map them to their own status code.
"""

from __future__ import annotations

import difflib
import errno
import re
from collections.abc import Iterable
from pathlib import Path

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # terminal colour codes some libraries put in messages
_ANNOUNCED_LINES = 4  # what a first line ending in a colon may pull in: the named thing, not a dump


def first_line(exc: BaseException) -> str:
    """`Type: first line of the message`: library messages run to pages; the CLI shows one line.

    A first line that ends in a colon announces what follows (onnx's checker: "...input 'h' of node:",
    then the node on the next lines), so the first lines of its paragraph are joined into the line instead."""
    text = _ANSI.sub("", str(exc))
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    shown = lines[0]
    if shown.endswith(":"):
        paragraph = text.strip().split("\n\n", 1)[0]
        shown = " ".join([line.strip() for line in paragraph.splitlines() if line.strip()][:_ANNOUNCED_LINES])
    return f"{type(exc).__name__}: {shown}"


def close_names(name: str, choices: Iterable[str], n: int = 3) -> list[str]:
    """The known names nearest a mistyped one, best first: what every "did you mean" offers."""
    return difflib.get_close_matches(name, list(choices), n=n)


class Interrupted(BaseException):
    """Ctrl-C or SIGTERM (a CI cancel), raised by the CLI's signal handler. Not a KeyboardInterrupt: typer
    turns that into a silent exit 130 and user-code guards into a bad-input error; this one reaches the
    CLI's main() through every finally block, with the signal's number."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def reraise_interrupt(exc: BaseException) -> None:
    """Raise the interrupt `exc` was raised while handling, if any. A library interrupted half-way may fail
    on its own way out (torch's exporter: a half-imported module's AttributeError, then TorchExportError),
    and whoever turns that failure into a StepFailed or a one-line error would report an interrupt as a
    broken model."""
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        if isinstance(link, Interrupted):
            raise link
        seen.add(id(link))
        link = link.__cause__ or link.__context__


class TemperError(Exception):
    """Base class: `exit_code` is what the CLI returns, `str(err)` the one line it prints."""

    exit_code = 1


class RecipeError(TemperError):
    """Bad input: the recipe or something it refers to. Always names the file and key."""

    exit_code = 2

    def __init__(self, file: str, key: str, message: str) -> None:
        self.file, self.key, self.message = file, key, message
        where = f"{file}: {key}: " if key else f"{file}: "
        super().__init__(where + message)


class OptionError(ValueError):
    """Raised by a step's `validate` about one of its own options; the runner adds file and key path."""

    def __init__(self, key: str, message: str) -> None:
        self.key, self.message = key, message
        super().__init__(f"{key}: {message}")


class StepFailed(TemperError):
    """A step ran and could not produce a trustworthy model (export mismatch, NaN after FP16...)."""

    exit_code = 1

    @property
    def kind(self) -> str:
        """"error" when code raised while building (the cause, kept by `raise ... from`, is an exception of
        a library, of temper or of the environment: a missing file, a crash), "rejected" when the step's
        own check refused the model it built (NaN/Inf, a mismatch): a verdict on the candidate, like a gate's."""
        cause = self.__cause__
        return "rejected" if cause is None or isinstance(cause, StepFailed) else "error"


class EnvironmentProblem(TemperError):
    """The machine lacks something the recipe needs (a provider, a library, a GPU)."""

    exit_code = 3


def unwritable(target: Path | str, key: str, exc: OSError, what: str) -> TemperError:
    """An OSError while writing `what` at `target` (named by `key`) as its one line: a full disk is the
    environment (exit 3); a file in the way, a read-only folder or a missing permission is the argument (exit 2)."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return EnvironmentProblem(f"{target}: {key}: {exc.strerror} while writing {what}; free some space or choose "
                                  "another folder (nothing was replaced)")
    blocker = _file_in_the_way(Path(exc.filename)) if exc.errno in (errno.ENOTDIR, errno.EEXIST) and exc.filename \
        else None
    if blocker is not None:
        return RecipeError(str(target), key, f"{blocker} is a file, not a folder: choose another folder")
    return RecipeError(str(target), key, f"could not be written ({exc.strerror}); choose a folder you can write")


def _file_in_the_way(path: Path) -> Path | None:
    """The file that stands where `path` or one of its folders should be (mkdir's EEXIST, ENOTDIR below a file)."""
    return next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), None)


# Request errors: why the serving runtime did not answer one request.

class RequestError(ValueError):
    """Bad request (HTTP 400, gRPC INVALID_ARGUMENT): the message says what is wrong."""


class Overloaded(RuntimeError):
    """Queue full (HTTP 503, gRPC UNAVAILABLE, as Triton)."""


class RequestTimeout(TimeoutError):
    """Not answered within config.timeout_s (HTTP 504, gRPC DEADLINE_EXCEEDED)."""


class Stopped(RuntimeError):
    """The runtime was stopped (HTTP 503, gRPC UNAVAILABLE): a request submitted afterwards, or
    still queued when it stopped, fails with this at once instead of waiting for a batcher that
    no longer runs."""


class InstanceLost(Stopped):
    """The worker process running this request's batch died (HTTP 503, gRPC UNAVAILABLE): the request is
    not retried, since it may be what crashed the worker (artifacts/serving/workers.py)."""
