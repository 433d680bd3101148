"""What benchmarks/soak.py and its arena check run on: the MiniLM model, its serving bundle, and
`temper serve` on a free loopback port."""

from __future__ import annotations

import http.client
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "recipes" / "minilm.yaml"
MiB = 1024 * 1024
TEMPER = [sys.executable, "-c", "import sys; from temper.pipeline.cli import main; sys.argv[0] = 'temper'; main()"]


def log(*parts: object) -> None:
    print(*parts, file=sys.stderr, flush=True)


# -- model and bundle ------------------------------------------------------------------------


def build_minilm(base: Path, candidate: str) -> Path:
    """`temper run recipes/minilm.yaml` into base/minilm with a private step cache; the candidate's model.

    The recipe runs as a copy without its publish section (beside the original: its paths are
    relative), so the soak registers nothing anywhere. An existing output is reused."""
    import yaml

    model = base / "minilm" / candidate / "model.onnx"
    if model.is_file():
        return model
    data = yaml.safe_load(RECIPE.read_text())
    data.pop("publish", None)
    copy = RECIPE.parent / f".soak-{RECIPE.stem}.yaml"
    copy.write_text(f"# temporary copy of {RECIPE.name} written by benchmarks/soak_model.py; safe to delete\n"
                    + yaml.safe_dump(data, sort_keys=False))
    env = {**os.environ, "TEMPER_CACHE_DIR": str(base / "cache"),
           "MLFLOW_TRACKING_URI": f"sqlite:///{base / 'mlflow.db'}"}  # nothing lands in the caller's store
    log(f"=== temper run {RECIPE} --output {base / 'minilm'} (minutes, once per --out-base)")
    try:
        rc = subprocess.run([*TEMPER, "run", str(copy), "--output", str(base / "minilm")], cwd=ROOT, env=env,
                            stdout=sys.stderr, stderr=sys.stderr).returncode
    finally:
        copy.unlink(missing_ok=True)
    if not model.is_file():
        raise SystemExit(f"error: temper run exited {rc} without {model}")
    return model


def make_bundle(model: Path, dest: Path, name: str = "minilm", max_batch_size: int = 32) -> Path:
    """A serving bundle padding the token inputs to the longest in each batch."""
    from temper.artifacts.formats import bundle

    config = bundle.config_for(model, name, max_batch_size=max_batch_size, max_delay_ms=10, max_queue=256,
                               pad={"input_ids": 0, "attention_mask": 0})
    return bundle.write(dest, model, config)


# -- server ------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(port: int, method: str, path: str, timeout: float = 10) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


@contextmanager
def serving(bundle: Path, logfile: Path, ready_within_s: float = 300,
            options: tuple[str, ...] = ()) -> Iterator[tuple[subprocess.Popen, int]]:
    """`temper serve BUNDLE [OPTIONS]` on a free loopback port, in its own session; (process, port) once ready.
    Stopped by its PID (SIGINT to its own process group, SIGKILL after 30 s)."""
    port = free_port()
    with open(logfile, "ab") as out:
        proc = subprocess.Popen([*TEMPER, "serve", str(bundle), "--port", str(port), *options], cwd=ROOT, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + ready_within_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"temper serve exited {proc.returncode} while starting: "
                                   f"{logfile.read_text()[-2000:]}")
            try:
                if request(port, "GET", "/v2/health/ready", timeout=2)[0] == 200:
                    break
            except OSError:
                pass  # not listening yet
            if time.monotonic() > deadline:
                raise RuntimeError(f"temper serve not ready within {ready_within_s:.0f}s; see {logfile}")
            time.sleep(0.2)
        yield proc, port
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)  # start_new_session: the group is this server alone
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def counters(port: int) -> dict[str, float]:
    """The server's Prometheus counters by name (one model: labels dropped)."""
    status, body = request(port, "GET", "/metrics")
    if status != 200:
        return {}
    found = re.findall(r"^(\w+)\{[^}]*\} (\S+)$", body.decode(), flags=re.MULTILINE)
    return {name: float(value) for name, value in found}
