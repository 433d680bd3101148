"""GPU memory as the NVIDIA driver reports it (nvidia-smi): what a model's processes hold, and each device.

ONNX Runtime's Python API exposes no statistics of its CUDA arena, so the speed gates (report.json
`gpu_mem_mb`), `/metrics` and `/v2/models/stats` read the driver's own figure: the memory each process
holds (its CUDA context included). In a container whose PID namespace hides processes from the driver,
nvidia-smi lists none, and the devices' used memory stands in (exact on a GPU the host lends to one job).
Every call is best-effort: no nvidia-smi, or one that fails, is None, never an exception.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterable

TIMEOUT_S = 10


def _query(what: str, fields: str) -> list[list[str]] | None:
    """nvidia-smi's CSV rows for `--query-<what>=<fields>` (no header, no units), None when it cannot answer."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        done = subprocess.run([smi, f"--query-{what}={fields}", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=TIMEOUT_S, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return parse(done.stdout)


def parse(text: str) -> list[list[str]]:
    """nvidia-smi's CSV lines as fields."""
    return [[field.strip() for field in line.split(",")] for line in text.strip().splitlines() if line.strip()]


def by_process(rows: list[list[str]]) -> dict[int, float]:
    """pid -> MiB from --query-compute-apps=pid,used_memory rows (a row the driver gives as [N/A] is left out)."""
    found: dict[int, float] = {}
    for row in rows:
        if len(row) >= 2 and row[0].isdigit():
            try:
                found[int(row[0])] = found.get(int(row[0]), 0.0) + float(row[1])
            except ValueError:
                continue
    return found


def devices() -> list[tuple[str, float, float]] | None:
    """Each GPU's (uuid, used MiB, total MiB); None without nvidia-smi."""
    rows = _query("gpu", "uuid,memory.used,memory.total")
    if rows is None:
        return None
    return [(row[0], float(row[1]), float(row[2])) for row in rows if len(row) >= 3 and _number(row[1], row[2])]


def used_mb(pids: Iterable[int]) -> float | None:
    """MiB the processes `pids` hold on the GPUs; where the driver lists no process at all, the devices' used
    memory; None without nvidia-smi."""
    rows = _query("compute-apps", "pid,used_memory")
    if rows is None:
        return None
    held = by_process(rows)
    if held:
        return sum(held.get(pid, 0.0) for pid in set(pids))
    gpus = devices()
    return sum(used for _, used, _ in gpus) if gpus else None


def _number(*values: str) -> bool:
    try:
        [float(v) for v in values]
    except ValueError:
        return False
    return True
