"""Crashes an operator can see and an orchestrator can act on (#37.3), through `temper serve` itself: each
worker death is one log line with its signal; an instance that keeps dying is taken out, which the repository
index says apart from restarting; a server whose every model is taken out fails its liveness probe (so
Kubernetes restarts the pod), and an explicit load starts the model anew. Workers are ended with real SIGSEGVs."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import psutil

from tests.artifacts.repositories import make_repository
from tests.artifacts.servers import MODEL, Client, _temper_serve

DEATHS = 3  # artifacts.serving.workers.CRASH_LOOP_DEATHS


def _workers(repo: Path) -> list[psutil.Process]:
    """The worker processes serving a model of `repo` (their spec names its path)."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        line = " ".join(process.info["cmdline"] or [])
        if "temper.artifacts.serving.worker" in line and str(repo) in line:
            found.append(process)
    return found


def _wait(check, what: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := check():
            return found
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _index(client: Client) -> list[dict]:
    status, _, body = client.call("POST", "/v2/repository/index", b"{}")
    assert status == 200
    return json.loads(body)


def _alive(process: psutil.Process) -> bool:
    """Running and not a zombie; a process that exited (and was reaped) since it was listed is not."""
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _crash_until_taken_out(repo: Path, client: Client) -> None:
    for death in range(DEATHS):
        (worker,) = _wait(lambda: [w for w in _workers(repo) if _alive(w)], "a worker")
        if death:  # restarted: wait for it to be ready again before the next crash
            _wait(lambda: client.call("GET", f"/v2/models/{MODEL}/ready")[0] == 200, "the model ready again")
        os.kill(worker.pid, signal.SIGSEGV)
        _wait(lambda w=worker: not w.is_running() or not _alive(w), "the worker to die")


def test_a_model_whose_workers_keep_crashing_is_taken_out_seen_and_revived(tmp_path: Path) -> None:
    repo = make_repository(tmp_path)
    args = ("--instances", "1", "--model-control-mode", "explicit", "--load-model", MODEL, "--no-strict-readiness")
    with _temper_serve(str(repo), args=args) as (port, output):
        client = Client(port)
        assert client.call("GET", "/v2/health/live")[0] == 200
        _crash_until_taken_out(repo, client)
        row = _wait(lambda: next((r for r in _index(client) if r["name"] == MODEL and "taken out" in
                                  r.get("reason", "")), None), "the index to say taken out")
        assert row["state"] == "UNAVAILABLE" and "(last: signal 11)" in row["reason"]
        status, _, body = client.call("GET", "/v2/health/live")
        assert status == 503 and b"taken out" in body  # the only model loaded serves nothing: restart the pod
        assert client.call("GET", f"/v2/models/{MODEL}/ready")[0] == 503
        status, _, body = client.call("POST", f"/v2/repository/models/{MODEL}/load", b"{}")
        assert status == 200, body
        assert client.call("GET", f"/v2/models/{MODEL}/ready")[0] == 200
        assert client.call("GET", "/v2/health/live")[0] == 200
        assert all("taken out" not in r.get("reason", "") for r in _index(client))
        client.close()
    lines = output["stderr"].splitlines()
    restarted = [line for line in lines if "worker (pid" in line and "died (signal 11); restarting it" in line]
    taken_out = [line for line in lines if "taken out: its worker died 3 times" in line and "(last: signal 11)" in line]
    assert len(restarted) == DEATHS - 1 and len(taken_out) == 1, output["stderr"]  # a line per death, its signal
