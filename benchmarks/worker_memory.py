"""A serving worker's memory under mixed request shapes (issue 37: "a worker-like session reached 1,278 MiB after 400
mixed MiniLM shapes against 757 MiB after the largest shape alone").

    HF_HUB_OFFLINE=1 .venv/bin/python -m benchmarks.worker_memory OUT/int8-dynamic OUT/baseline [--shapes 400]

Each MODEL is an ONNX model with token inputs (input_ids, attention_mask: int64 [batch, seq]), such as a
`temper run recipes/minilm.yaml` output folder's candidates. Per model and per ONNX Runtime memory setting, two fresh
processes, each a worker-like session (the session temper serve's workers open: artifacts/engines/onnxruntime.py
open_session with serving's default settings: every usable core, the CPU provider), then:
  largest  the largest shape (--max-batch x --max-seq) run 3 times: the memory a worker needs at most, per shape;
  mixed    the largest shape first, then --shapes random shapes (batch 1..max-batch, seq 8..max-seq, seeded),
           as a batcher padding each batch to its longest request makes them.
The RSS (VmRSS) after each and its peak during it (VmHWM: what the worker must be given), and the mean time per
run over the mixed shapes, as a ratio to the serving default's (a setting named twice in --settings runs twice, in
that order, so that drift on a shared host shows; the ratio is to the last `default`).
Settings: `default` (what serving uses: the CPU arena and memory patterns on, ONNX Runtime's defaults),
`no-pattern` (enable_mem_pattern off: no per-shape planned buffers), `no-arena` (enable_cpu_mem_arena off: freed
tensors go back to the allocator), `neither`, `shrink` (the default session, each run with RunOptions
`memory.enable_memory_arena_shrinkage = cpu:0`: the arena returns the chunks the run freed).

Markdown on stdout (host, load average and date first); progress on stderr.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.serving_host import log, machine

SETTINGS = {"default": {}, "no-pattern": {"enable_mem_pattern": False}, "no-arena": {"enable_cpu_mem_arena": False},
            "neither": {"enable_mem_pattern": False, "enable_cpu_mem_arena": False}, "shrink": {}}
SHRINK = "memory.enable_memory_arena_shrinkage"  # a RunOptions entry: the arena frees its unused chunks after a run


def rss_mib(field: str = "VmRSS") -> float:
    """This process's resident memory now (VmRSS), or its peak so far (VmHWM), MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field}")


def _feed(batch: int, seq: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    ids = rng.integers(1000, 20000, (batch, seq)).astype(np.int64)
    mask = np.ones((batch, seq), dtype=np.int64)
    return {"input_ids": ids, "attention_mask": mask}


def measure(model: str, setting: str, scenario: str, shapes: int, max_batch: int, max_seq: int) -> dict:
    """In a fresh process: open the worker-like session, run the scenario, report RSS and time per run."""
    from temper.artifacts.core.host import usable_cores
    from temper.artifacts.engines.onnxruntime import SessionSettings, open_session
    from temper.artifacts.engines.providers import CPU

    settings = SessionSettings(intra_op_threads=usable_cores())  # the serving default: every usable core
    options = settings.options()
    for key, value in SETTINGS[setting].items():
        setattr(options, key, value)
    import onnxruntime as ort

    run_options = ort.RunOptions()
    if setting == "shrink":
        run_options.add_run_config_entry(SHRINK, "cpu:0")
    if SETTINGS[setting]:
        session = ort.InferenceSession(model, options, providers=[CPU])
    else:
        session = open_session(Path(model), settings, [CPU])  # exactly what a worker opens
    names = [i.name for i in session.get_inputs()]
    rng = np.random.default_rng(37)
    loaded = rss_mib()
    largest = _feed(max_batch, max_seq, rng)
    session.run(None, {k: v for k, v in largest.items() if k in names}, run_options)
    times = []
    if scenario == "largest":
        for _ in range(2):
            session.run(None, {k: v for k, v in largest.items() if k in names}, run_options)
    else:
        for _ in range(shapes):
            feed = _feed(int(rng.integers(1, max_batch + 1)), int(rng.integers(8, max_seq + 1)), rng)
            began = time.perf_counter()
            session.run(None, {k: v for k, v in feed.items() if k in names}, run_options)
            times.append(time.perf_counter() - began)
    return {"loaded": loaded, "after": rss_mib(), "peak": rss_mib("VmHWM"),
            "ms": 1000 * statistics.mean(times) if times else float("nan")}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="+", type=Path, help="ONNX models or folders holding model.onnx")
    parser.add_argument("--shapes", type=int, default=400)
    parser.add_argument("--max-batch", type=int, default=32, help="recipes/minilm.yaml's max_batch_size")
    parser.add_argument("--max-seq", type=int, default=128, help="the tokenizer's padded length in the recipe")
    parser.add_argument("--settings", default=",".join(SETTINGS), help="which of: " + ", ".join(SETTINGS))
    args = parser.parse_args(argv)
    host = machine()
    load = [os.getloadavg()[0]]
    rows = []
    context = multiprocessing.get_context("spawn")  # a fresh process per point: nothing of the last one's memory
    for model in args.models:
        path = str(model / "model.onnx" if model.is_dir() else model)
        for setting in args.settings.split(","):
            point = {}
            for scenario in ("largest", "mixed"):
                log(f"{model.name} {setting} {scenario}")
                with context.Pool(1) as pool:
                    point[scenario] = pool.apply(measure, (path, setting, scenario, args.shapes, args.max_batch,
                                                           args.max_seq))
                load.append(os.getloadavg()[0])
            rows.append((model.name, setting, point))
    print(f"Host: {host['cpu']}, {host['cores']} cores, onnxruntime {host['ort']}, {host['date']}; load average "
          f"{min(load):.1f}-{max(load):.1f} (1 min, sampled between points). Largest shape {args.max_batch} x "
          f"{args.max_seq}; mixed: it, then {args.shapes} random shapes (batch 1-{args.max_batch}, seq "
          f"8-{args.max_seq}, seed 37).\n")
    print("| model | session memory setting | RSS loaded MiB | RSS after largest x3 MiB | RSS after mixed MiB | "
          "mixed / largest | peak largest / mixed MiB | mean ms per mixed run | vs default |")
    print("|---|---|---|---|---|---|---|---|---|")
    base = {name: point["mixed"]["ms"] for name, setting, point in rows if setting == "default"}
    for name, setting, point in rows:
        largest, mixed = point["largest"], point["mixed"]
        ratio = f"{mixed['ms'] / base[name]:.2f}x" if name in base else ""
        print(f"| {name} | {setting} | {largest['loaded']:.0f} | {largest['after']:.0f} | {mixed['after']:.0f} | "
              f"{mixed['after'] / largest['after']:.2f}x | {largest['peak']:.0f} / {mixed['peak']:.0f} | "
              f"{mixed['ms']:.1f} | {ratio} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
