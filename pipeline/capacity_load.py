"""The two real processes a capacity point takes: `temper serve` of the bundle with one serving configuration, and
Triton's perf_analyzer offering it one open-loop request rate (`--request-rate-range R:R:1`, Poisson arrivals,
a fixed request count). Each point's figures come from perf_analyzer's own output: the per-request send and
answer timestamps of `--profile-export-file` (p50, p99, mean, the rate sent, requests left unanswered), the
server's average queue time from its CSV (`-f`, read from the server's statistics), and its own warning when it
could not keep up with the rate ("N% of the requests were delayed"). The rate sent is the count over the span
of send times: with Poisson arrivals split over perf_analyzer's threads it reads low on short runs, so it is
shown, not judged; the delayed share is."""

from __future__ import annotations

import contextlib
import csv
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from temper.artifacts.core.errors import EnvironmentProblem
from temper.artifacts.formats.bundle import CONFIG, MODEL, ServingConfig
from temper.artifacts.formats.capacity import Choice, Point
from temper.artifacts.formats.integrity import MANIFEST, REPORT

READY_S = 300  # loading and warming up every batch size of a large model on a busy host
LATE_PCT = 5.0  # perf_analyzer sent more than 5% of the requests late: it did not offer the rate
_SERVE = "import sys; from temper.pipeline.cli import main; sys.argv[0] = 'temper'; main()"


@dataclass(frozen=True)
class Load:
    """How each point is offered: perf_analyzer's path, the protocol, the seconds of requests per point."""

    perf_analyzer: str
    protocol: str = "http"
    seconds: float = 3.0
    minimum: int = 50  # requests per point at least, so a low rate's p99 is not its maximum

    def version(self) -> str:
        try:
            run = subprocess.run([self.perf_analyzer, "--version"], capture_output=True, text=True, timeout=60)
        except OSError as exc:
            raise EnvironmentProblem(f"--perf-analyzer: cannot run {self.perf_analyzer}: {exc.strerror or exc}: "
                                     "`make perf-analyzer` installs one into .cache/perf_analyzer/ (its `run` "
                                     "wrapper), or use Triton's SDK image") from exc
        words = (run.stdout + run.stderr).split()
        found = [w for w in words if w[:1].isdigit()]
        return f"perf_analyzer {found[0] if found else '(version unknown)'}"


@dataclass
class Served:
    """A running `temper serve` of one configuration."""

    name: str
    port: int
    grpc_port: int
    process: subprocess.Popen

    def memory(self) -> int | None:
        """The server's resident memory and its workers' (its /metrics), bytes; None if it cannot be read."""
        from prometheus_client.parser import text_string_to_metric_families

        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10) as answer:
                text = answer.read().decode()
        except OSError:
            return None
        total = 0.0
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "process_resident_memory_bytes" or (
                        sample.name == "temper_model_memory_bytes" and sample.labels.get("measure") == "workers_rss"):
                    total += sample.value
        return int(total) or None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def staged(bundle: Path, config: ServingConfig, choice: Choice, into: Path) -> Path:
    """A copy of the bundle that serves with `choice`'s batching: the model files linked, runtime.json rewritten,
    manifest and report copied (so the model is checked as it would be), no capacity.json."""
    folder = into / f"b{choice.max_batch_size}-d{choice.max_delay_ms:g}-i{choice.instances}"
    folder.mkdir(parents=True)
    for item in bundle.iterdir():
        if item.name == MODEL or item.name.startswith(MODEL + "."):
            (folder / item.name).symlink_to(item.resolve())
        elif item.name in (MANIFEST, REPORT):
            shutil.copy2(item, folder / item.name)
    serving = config.model_copy(update={"max_batch_size": choice.max_batch_size, "max_delay_ms": choice.max_delay_ms})
    (folder / CONFIG).write_text(serving.model_dump_json(indent=2) + "\n")
    return folder


@contextlib.contextmanager
def served(bundle: Path, config: ServingConfig, choice: Choice) -> Iterator[Served]:
    """`temper serve` of the bundle with `choice`, on free loopback ports (REST and gRPC), once ready; stopped
    with Ctrl-C (SIGINT) when the block ends."""
    with tempfile.TemporaryDirectory(prefix="temper-capacity-") as tmp:
        folder = staged(bundle, config, choice, Path(tmp))
        port, grpc_port = _free_port(), _free_port()
        args = [sys.executable, "-c", _SERVE, "serve", str(folder), "--port", str(port), "--grpc-port",
                str(grpc_port), "--instances", str(choice.instances)]
        log = Path(tmp) / "serve.log"
        with open(log, "w") as sink:
            process = subprocess.Popen(args, stdout=sink, stderr=subprocess.STDOUT, env=os.environ.copy())
        try:
            _wait_ready(process, port, log)
            yield Served(config.name, port, grpc_port, process)
        finally:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _wait_ready(process: subprocess.Popen, port: int, log: Path) -> None:
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            lines = log.read_text().strip().splitlines()
            raise EnvironmentProblem(f"temper serve stopped before it was ready (exit {process.returncode}): "
                                     f"{lines[-1] if lines else 'no output'}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=5) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise EnvironmentProblem(f"temper serve was not ready within {READY_S} s")


def offer(load: Load, server: Served, choice: Choice, rate: float, target_ms: float, round_: int = 0) -> Point:
    """One open-loop run of perf_analyzer at `rate` requests/s against `server`."""
    timed = math.ceil(rate * load.seconds)
    count = max(timed, min(load.minimum, 4 * timed))  # a low rate: more requests, within 4x the seconds
    port = server.port if load.protocol == "http" else server.grpc_port
    with tempfile.TemporaryDirectory(prefix="temper-perf-") as tmp:
        export, table = Path(tmp) / "profile.json", Path(tmp) / "table.csv"
        args = [load.perf_analyzer, "-m", server.name, "-i", load.protocol, "-u", f"127.0.0.1:{port}",
                "--request-rate-range", f"{rate:.3f}:{rate:.3f}:1", "--request-distribution", "poisson",
                "--request-count", str(count), "--percentile=99", "-f", str(table),
                "--profile-export-file", str(export)]
        try:
            run = subprocess.run(args, capture_output=True, text=True, timeout=count / rate * 4 + 60)
            said = run.stdout + run.stderr
        except subprocess.TimeoutExpired:
            said = ""  # no export: every request counts as unanswered
        late = re.search(r"([0-9.]+)% of the requests were delayed", said)
        sends, latencies = _requests(export)
        queue_us = _queue_us(table)
    sent = (len(sends) - 1) / ((sends.max() - sends.min()) / 1e9) if len(sends) > 1 and np.ptp(sends) > 0 else 0.0
    errors = count - len(latencies) if len(sends) else count
    answered = len(latencies) / (count / rate)
    p99 = float(np.percentile(latencies, 99)) if len(latencies) else None
    delayed = float(late.group(1)) if late else 0.0
    under = bool(p99 is not None and p99 <= target_ms and errors == 0 and delayed <= LATE_PCT)
    return Point(choice=choice, rate=round(rate, 3), sent=round(sent, 2), answered=round(answered, 2),
                 p50_ms=_ms(np.median(latencies)) if len(latencies) else None, p99_ms=_ms(p99),
                 mean_ms=_ms(np.mean(latencies)) if len(latencies) else None, requests=count, errors=errors,
                 queue_us=queue_us, delayed_pct=delayed, memory_bytes=server.memory(), under=under, round=round_)


def _ms(value: float | None) -> float | None:
    return None if value is None else round(float(value), 4)


def _requests(export: Path) -> tuple[np.ndarray, np.ndarray]:
    """(send timestamps in ns, latencies in ms of the answered requests) from perf_analyzer's profile export;
    empty arrays when it wrote none (it failed, or was stopped). Its output tensors are raw bytes inside JSON
    strings, so the file is read as latin-1 (the timestamps are plain digits either way)."""
    if not export.is_file():
        return np.array([]), np.array([])
    try:
        document = json.loads(export.read_bytes().decode("latin-1"))
        requests = [r for e in document["experiments"] for r in e["requests"]]
    except (ValueError, KeyError, TypeError):
        return np.array([]), np.array([])
    sends = np.array([r["timestamp"] for r in requests], dtype=np.float64)
    latencies = np.array([(r["response_timestamps"][-1] - r["timestamp"]) / 1e6 for r in requests
                          if r.get("response_timestamps")], dtype=np.float64)
    return sends, latencies


def _queue_us(table: Path) -> float | None:
    """The server's average queue time per request in the run (perf_analyzer's CSV, "Server Queue", µs)."""
    try:
        rows = list(csv.DictReader(table.read_text().splitlines()))
        return float(rows[-1]["Server Queue"])
    except (OSError, IndexError, KeyError, ValueError):
        return None
