"""What native code may write on the process's own stderr: ONNX Runtime's logger and onnx-simplifier's prints.

Both write from C++ straight to file descriptor 2, past Python's sys.stderr: ONNX Runtime a red
`[E:onnxruntime:...]` line before every error it also raises (the one line temper prints), onnx-simplifier
`WARNING: failed to run "Concat" op ..., skip...` for each constant it cannot fold (it keeps the node).
Neither says anything the user can act on that temper's own line does not, so the command line keeps them
out of the console unless `--debug` (`quiet(True)`); library use keeps ONNX Runtime's errors, as before.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator

WARNINGS, ERRORS, FATAL = 2, 3, 4  # ONNX Runtime's logging severities: what is logged, at least

_state = {"severity": ERRORS, "quiet": False}


def quiet(yes: bool) -> None:
    """The command line's choice: `yes` (no --debug) logs only what kills the process; `--debug` warnings too.
    Takes effect for the sessions opened afterwards and, through `apply`, for ONNX Runtime's default logger."""
    _state.update(severity=FATAL if yes else WARNINGS, quiet=yes)


def severity() -> int:
    """The `log_severity_level` of every session temper opens."""
    return _state["severity"]


def apply() -> None:
    """Set ONNX Runtime's default logger to `severity()`: the sessions libraries open (onnx-simplifier's check,
    the quantizers' calibration) log through it."""
    import onnxruntime

    onnxruntime.set_default_logger_severity(severity())


@contextlib.contextmanager
def silenced() -> Iterator[None]:
    """Around a native call that prints on file descriptors 1 and 2 (onnx-simplifier's C++): what it writes is
    dropped when `quiet`, shown as it comes otherwise."""
    if not _state["quiet"]:
        yield
        return
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    saved = [os.dup(fd) for fd in (1, 2)]
    try:
        with tempfile.TemporaryFile() as sink:
            for fd in (1, 2):
                os.dup2(sink.fileno(), fd)
            try:
                yield
            finally:
                for stream in (sys.stdout, sys.stderr):
                    stream.flush()
                for fd, kept in zip((1, 2), saved, strict=True):
                    os.dup2(kept, fd)
    finally:
        for kept in saved:
            os.close(kept)
