"""Two runs in different PID namespaces sharing a temp folder (two CI containers sharing a workspace), through
the console script: the second run's cleanup of dead runs' scratch folders must not delete the first run's
live one, whose process id means nothing in the second's namespace. The cleanup used to ask whether a process
of the id in the folder's name runs; it now asks the folder's lock, which a live run holds wherever it runs."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.pipeline.test_cli_contract import TEMPER, one_line, temper, tiny_recipe


def _unshare() -> list[str] | None:
    """The command that starts a process in a PID namespace of its own, where this user may (root, or
    unprivileged user namespaces); None where not."""
    if shutil.which("unshare") is None:
        return None
    for command in (["unshare", "--pid", "--fork", "--mount-proc"],
                    ["unshare", "--pid", "--fork", "--mount-proc", "--map-root-user"]):
        if subprocess.run([*command, "true"], capture_output=True).returncode == 0:
            return command
    return None


UNSHARE = _unshare()


@pytest.mark.skipif(UNSHARE is None, reason="cannot start a process in a PID namespace of its own here")
def test_a_run_in_another_pid_namespace_keeps_its_scratch(tmp_path: Path) -> None:
    temp, first, second = tmp_path / "tmp", tmp_path / "first", tmp_path / "second"
    for folder in (temp, first, second):
        folder.mkdir()
    slow = tiny_recipe(first, validate={"throughput": {"batch_sizes": [1, 8], "duration_s": 4, "warmup_s": 0,
                                                       "min_speedup": 0.01}})
    quick = tiny_recipe(second)
    env = {**os.environ, "TMPDIR": str(temp)}
    run = subprocess.Popen([str(TEMPER), "run", slow, "--output", first / "out"], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 120
        while not (scratch := list(temp.glob(f"temper-run-{run.pid}-*[!k]"))):  # the folder, not its .lock
            assert run.poll() is None and time.monotonic() < deadline, "the first run ended before its scratch appeared"
            time.sleep(0.05)
        # the second run: its own PID namespace (run.pid names no process there), the same temp folder
        assert UNSHARE is not None
        other = subprocess.run([*UNSHARE, str(TEMPER), "check", quick],
                               capture_output=True, text=True, env=env, timeout=300)
        assert other.returncode == 0, other.stderr
        assert run.poll() is None, "the first run ended before the second swept: make it slower"
        assert scratch[0].is_dir(), "the second run deleted the first run's live scratch folder"
        stdout, stderr = run.communicate(timeout=300)
    finally:
        run.kill()
    assert run.returncode == 0, stderr
    assert list(temp.glob("temper-*")) == []  # each run took its scratch and its lock with it


def test_a_killed_runs_scratch_and_lock_are_swept(tmp_path: Path) -> None:
    """A SIGKILLed run leaves its scratch and its lock file; the lock is free, so the next run removes both."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    recipe = tiny_recipe(tmp_path, validate={"throughput": {"batch_sizes": [1], "duration_s": 30, "warmup_s": 0}})
    env = {**os.environ, "TMPDIR": str(temp)}
    run = subprocess.Popen([str(TEMPER), "run", recipe, "--output", tmp_path / "out"], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, env=env)
    deadline = time.monotonic() + 120
    while len(list(temp.glob(f"temper-run-{run.pid}-*"))) < 2:  # the folder and its lock
        assert run.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    run.send_signal(signal.SIGKILL)
    run.wait()
    assert len(list(temp.glob("temper-run-*"))) == 2
    checked = temper("check", recipe, TMPDIR=str(temp))
    assert checked.returncode == 0, one_line(checked)
    assert list(temp.glob("temper-*")) == []
