"""The host side of benchmarks/serving.py: where the script and its programs are, the machine it runs on,
and how busy that machine is.

Every figure the benchmark prints depends on what else the two cores are doing, so the waits for a
quiet machine, the busiest-process note and the CPU meter that fills the `bg CPU` column live here,
apart from what is measured.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Self

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "serving.py"  # the entry point: the helper processes re-execute it with their role
BIN = Path(sys.executable).parent


def log(*parts: object) -> None:
    print(*parts, file=sys.stderr, flush=True)


def child_env(**extra: str) -> dict[str, str]:
    """The environment for the processes serving.py starts: this checkout first on PYTHONPATH, so the
    helper roles import `benchmarks.*` from beside the script. temper itself (`temper.*`) comes from the
    install, as in the parent (an inherited PYTHONPATH included): run the script from the environment
    whose editable install is this checkout."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, **extra}


# -- machine ---------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    return {
        "cpu": cpu,
        "cores": len(os.sched_getaffinity(0)),
        "ort": importlib.metadata.version("onnxruntime"),
        "mlflow": importlib.metadata.version("mlflow"),
        "python": platform.python_version(),
        "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
    }


def wait_for_quiet(threshold: float, max_wait: float) -> tuple[float, float, float]:
    """Wait (up to max_wait s) for the 1-minute load average to drop below threshold.
    Returns (load when asked, load when starting, seconds waited)."""
    first = os.getloadavg()[0]
    began = time.monotonic()
    load = first
    while load > threshold and time.monotonic() - began < max_wait:
        log(f"load average {load:.2f} > {threshold}: waiting ({time.monotonic() - began:.0f}/{max_wait:.0f} s)")
        time.sleep(min(15, max_wait))
        load = os.getloadavg()[0]
    return first, load, time.monotonic() - began


def top_processes(n: int = 3, window: float = 2.0) -> str:
    """The busiest processes over the next `window` seconds (CPU% from /proc deltas), for the load note."""
    def ticks() -> dict[int, tuple[str, int]]:
        seen = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                text = stat.read_text()
            except OSError:
                continue
            comm = text[text.index("(") + 1:text.rindex(")")]
            fields = text[text.rindex(")") + 2:].split()
            seen[int(stat.parent.name)] = (comm, int(fields[11]) + int(fields[12]))  # utime + stime
        return seen

    first = ticks()
    time.sleep(window)
    hz = os.sysconf("SC_CLK_TCK")
    busy = sorted(((t - first[pid][1]) / hz / window * 100, comm) for pid, (comm, t) in ticks().items() if pid in first)
    shown = [f"{comm} {pct:.0f}%" for pct, comm in reversed(busy[-n:]) if pct >= 5]
    return ", ".join(shown) or "none above 5% CPU"


# -- other work on the machine ---------------------------------------------------------------


class CpuMeter:
    """CPU used while it was open by every process except this script, the children it waited for
    (wrk) and the process trees under `roots` (the server being measured), in % of one core (200% =
    both cores of a 2-core machine): other work competing with the measurement, the idle server of
    the other kind included."""

    def __init__(self, roots: tuple[int, ...] = ()) -> None:
        self.roots = roots

    def __enter__(self) -> Self:
        self.began, self.busy, self.ours = time.monotonic(), _busy_ticks(), _our_ticks(self.roots)
        return self

    def __exit__(self, *exc: object) -> None:
        wall = time.monotonic() - self.began
        others = (_busy_ticks() - self.busy) - (_our_ticks(self.roots) - self.ours)
        self.percent = max(0.0, others / os.sysconf("SC_CLK_TCK") / wall * 100) if wall else 0.0


def _busy_ticks() -> int:
    first_line = Path("/proc/stat").read_text().split("\n", 1)[0]
    user, nice, system, _idle, _iowait, irq, softirq = map(int, first_line.split()[1:8])
    return user + nice + system + irq + softirq


def _our_ticks(roots: tuple[int, ...]) -> int:
    """utime+stime of this process and the children it waited for, plus the process trees under `roots`."""
    parents, ticks = {}, {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2:].split()
        pid = int(stat.parent.name)
        parents[pid] = int(fields[1])
        children = int(fields[13]) + int(fields[14]) if pid == os.getpid() else 0  # cutime + cstime: reaped ones
        ticks[pid] = int(fields[11]) + int(fields[12]) + children
    total = ticks.get(os.getpid(), 0)
    for pid, used in ticks.items():
        p = pid
        while p > 1 and p not in roots:
            p = parents.get(p, 0)
        if p in roots:
            total += used
    return total


def wait_quiet(max_wait: float, limit: float = 10.0) -> float:
    """Wait up to max_wait s until processes outside the benchmark use under `limit`% CPU over 2 s;
    the seconds waited."""
    began = time.monotonic()
    while True:
        with CpuMeter() as meter:
            time.sleep(2)
        waited = time.monotonic() - began
        if meter.percent < limit or waited >= max_wait:
            return waited
        log(f"  other processes use {meter.percent:.0f}% CPU: waiting ({waited:.0f}/{max_wait:.0f} s)")
