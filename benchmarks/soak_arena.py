"""The arena check of benchmarks/soak.py (`--arena`): ONNX Runtime's CPU arena and memory patterns are
sized by the shapes a session has seen, so the same random shapes run on sessions built with different memory
options, each variant in a fresh process, to show which options keep RSS flat and what they cost per run."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import psutil

from benchmarks.soak_setup import ROOT, MiB, build_minilm, log

# What each variant changes on top of the session artifacts/engines/threads.py opens for the runtime today.
VARIANTS = {
    "runtime": "as artifacts/engines/threads.py opens it (CPU arena, extend kNextPowerOfTwo, memory patterns on)",
    "no-mem-pattern": "SessionOptions.enable_mem_pattern = False",
    "shrink": "RunOptions memory.enable_memory_arena_shrinkage = cpu:0 on every run",
    "same-as-requested": "a shared CPU arena with arena_extend_strategy kSameAsRequested (session.use_env_allocators)",
    "same+no-pattern": "kSameAsRequested shared arena and enable_mem_pattern = False",
    "no-arena": "SessionOptions.enable_cpu_mem_arena = False (plain malloc)",
}


def variant_session(model: Path, variant: str) -> tuple[ort.InferenceSession, ort.RunOptions | None]:
    """A session like engines.open_session's (all usable cores, intra-op threads that sleep) with `variant`'s change."""
    from temper.artifacts.core.host import usable_cores

    options = ort.SessionOptions()
    options.intra_op_num_threads = usable_cores()
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    run_options = None
    if variant in ("no-mem-pattern", "same+no-pattern"):
        options.enable_mem_pattern = False
    if variant == "no-arena":
        options.enable_cpu_mem_arena = False
    if variant == "shrink":
        run_options = ort.RunOptions()
        run_options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
    if variant in ("same-as-requested", "same+no-pattern"):
        cpu = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
        ort.create_and_register_allocator(cpu, ort.OrtArenaCfg({"arena_extend_strategy": 1}))  # 1 = kSameAsRequested
        options.add_session_config_entry("session.use_env_allocators", "1")
    return ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"]), run_options


def arena_child(model: Path, variants: list[str], runs: int, seed: int) -> None:
    """Run `runs` random shapes on each variant's session, variants interleaved per shape (rotating
    who goes first) so that load from other processes hits them alike; print one JSON line of
    milliseconds per run by variant and of RSS after each shape (one variant: that session's)."""
    sessions = {variant: variant_session(model, variant) for variant in variants}
    names = [i.name for i in next(iter(sessions.values()))[0].get_inputs()]
    rng = np.random.default_rng(seed)  # the same shapes in every child
    me = psutil.Process()
    rss: list[int] = []
    ms: dict[str, list[float]] = {variant: [] for variant in variants}
    for turn in range(runs):
        rows, length = int(rng.integers(1, 33)), int(rng.integers(8, 129))
        feed = {name: (np.ones((rows, length), np.int64) if "mask" in name
                       else rng.integers(1000, 30000, (rows, length), dtype=np.int64)) for name in names}
        for variant in variants[turn % len(variants):] + variants[: turn % len(variants)]:
            session, run_options = sessions[variant]
            began = time.perf_counter()
            session.run(None, feed, run_options)
            ms[variant].append((time.perf_counter() - began) * 1000)
        rss.append(me.memory_info().rss)
    print(json.dumps({"rss": rss, "ms": ms}))


def arena(args: argparse.Namespace, base: Path) -> int:
    """RSS per variant, each alone in a fresh process; then their speed, interleaved in one process."""
    model = args.model or build_minilm(base, args.candidate)

    def child(variants: list[str], runs: int) -> dict:
        command = [sys.executable, "-m", "benchmarks.soak", "--arena-child", ",".join(variants), "--model",
                   str(model), "--runs", str(runs), "--seed", str(args.seed)]
        found = subprocess.run(command, capture_output=True, text=True, timeout=args.seconds, cwd=ROOT)
        if found.returncode:
            log(found.stderr[-2000:])
            raise SystemExit(f"error: {variants} exited {found.returncode}")
        return json.loads(found.stdout.strip().splitlines()[-1])

    rss = {}
    for variant in VARIANTS:
        log(f"=== {variant}: RSS over {args.runs} runs of random shapes (rows 1-32, seq 8-128)")
        rss[variant] = child([variant], args.runs)["rss"]
    log(f"=== speed: {args.timing_runs} shapes, every variant on each, interleaved")
    ms = child(list(VARIANTS), args.timing_runs)["ms"]
    print("| variant | RSS after warm-up (MiB) | RSS at the end | change | peak | ms/run (median) | vs runtime "
          "| what |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    warm_at = int(args.runs * args.warmup_fraction)
    for variant, samples in rss.items():
        warm, end, median = samples[warm_at], samples[-1], float(np.median(ms[variant]))
        ratio = float(np.median(np.array(ms[variant]) / np.array(ms["runtime"])))
        print(f"| {variant} | {warm / MiB:,.0f} | {end / MiB:,.0f} | {end / warm - 1:+.1%} | {max(samples) / MiB:,.0f} "
              f"| {median:.1f} | {ratio:.2f}x | {VARIANTS[variant]} |")
    print(f"\nms/run: median over {args.timing_runs} shapes; vs runtime: median of the per-shape time ratios")
    plot_arena(rss, warm_at, args.png)
    print(f"plot: {args.png}")
    return 0


def plot_arena(rss: dict[str, list[int]], warm_at: int, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    for variant, samples in rss.items():
        ax.plot([value / MiB for value in samples], label=variant)
    ax.axvline(warm_at, color="grey", linestyle="--", label="end of warm-up")
    ax.set(xlabel="run", ylabel="RSS (MiB)", title="ONNX Runtime session RSS over random shapes, by memory option")
    ax.set_ylim(bottom=0)
    ax.legend()
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)
