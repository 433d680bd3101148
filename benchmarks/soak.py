"""Soak `temper serve` with mixed-shape token traffic and watch whether the server's memory stays flat.

    .venv/bin/python -m benchmarks.soak [--model MODEL.onnx] [--requests N] [--seconds S] [--clients C]
                                        [--instances N [--kill-worker-at S]]
    .venv/bin/python -m benchmarks.soak --arena [--model MODEL.onnx] [--runs N]

Serving soak (default): a bundle of the MiniLM int8-dynamic candidate (built by `temper run
recipes/minilm.yaml` in a private cache with the recipe's publish section dropped, unless --model
names an ONNX file) with pad {input_ids: 0, attention_mask: 0} and max_batch_size 32, served by
`temper serve` on 127.0.0.1. C closed-loop clients send random batch sizes (1..16) of random sequence
lengths (8..128) with Triton's binary tensor extension until N requests or S seconds. The server's
RSS is sampled by PID every --sample-s. Printed: requests, errors (must be 0), RSS after warm-up vs
at the end (target: within +-10%), p50/p99 latency, the average batch formed; the RSS curve goes to
a PNG. Exit status 1 when a request failed or the RSS moved more than --tolerance after warm-up.

With --instances the RSS is the server's and its worker processes' together. --kill-worker-at S
SIGKILLs one worker S seconds in, as a native crash would end it: the requests of the batch it held
get 503 (artifacts/serving/workers.py does not retry them) and count as lost to the kill, not as errors
(at most --clients of them, one per client in flight); every other reply must still be right. The
soak then times the recovery (until /metrics reports every instance ready again) and checks that
the RSS after the restart is still within --tolerance of the warm RSS before it.

Arena check (--arena): ONNX Runtime's CPU arena and memory patterns are sized by the shapes a session
has seen, so a server that meets many shapes can grow. The same random shapes (batches up to 32 rows,
as the batcher merges them) run directly on sessions built with different memory options, each
variant in a fresh process, and the table shows which options keep RSS flat and what they cost per
run. The options are built here, not in artifacts/engines/threads.py (which opens the serving runtime's
sessions), so they can be compared before one is adopted there.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import itertools
import json
import os
import re
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import psutil

from benchmarks.soak_arena import arena, arena_child
from benchmarks.soak_setup import (
    MiB,
    build_minilm,
    counters,
    free_port,
    log,
    make_bundle,
    request,
    serving,
)

__all__ = ["MiB", "build_minilm", "counters", "free_port", "log", "make_bundle", "request", "serving"]


# -- load and RSS ------------------------------------------------------------------------------


@dataclass
class Load:
    """What the clients did; `done` is read by the RSS sampler while they run."""

    done: int = 0
    rows: int = 0
    errors: int = 0
    lost: int = 0  # 503 because the worker running the batch died (--kill-worker-at)
    first_errors: list[str] = field(default_factory=list)
    latencies_ms: list[float] = field(default_factory=list)
    seconds: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record(self, rows: int, latency_ms: float, error: str | None) -> None:
        with self._lock:
            self.done += 1
            if error is None:
                self.rows += rows
                self.latencies_ms.append(latency_ms)
            elif error.startswith("HTTP 503") and "died" in error:
                self.lost += 1
            else:
                self.errors += 1
                if len(self.first_errors) < 5:
                    self.first_errors.append(error)


def token_request(rng: np.random.Generator, rows: int, length: int, vocab: int) -> tuple[bytes, bytes]:
    """A binary-extension request: (JSON header, tensor bytes) for input_ids and attention_mask.

    The ids start with a CLS-like 101 and the mask is all ones: every row is as long as the request
    says; the server pads between requests of a batch."""
    ids = rng.integers(1000, vocab, (rows, length), dtype=np.int64)
    ids[:, 0] = 101
    mask = np.ones((rows, length), dtype=np.int64)
    tensors = [("input_ids", ids), ("attention_mask", mask)]
    head = {"inputs": [{"name": name, "shape": [rows, length], "datatype": "INT64",
                        "parameters": {"binary_data_size": a.nbytes}} for name, a in tensors],
            "parameters": {"binary_data_output": True}}
    return json.dumps(head).encode(), b"".join(a.astype("<i8").tobytes() for _, a in tensors)


def run_load(port: int, model: str, load: Load, requests: int, seconds: float, clients: int,
             max_rows: int = 16, lengths: tuple[int, int] = (8, 128), vocab: int = 30000, seed: int = 0) -> Load:
    """`clients` closed-loop keep-alive connections, random rows in 1..max_rows and lengths in
    lengths (inclusive), until `requests` were sent or `seconds` passed. A reply counts as an error
    unless it is HTTP 200 with one output row per input row."""
    tickets = itertools.count()
    deadline = time.monotonic() + seconds
    path = f"/v2/models/{model}/infer"

    def client(index: int) -> None:
        rng = np.random.default_rng([seed, index])
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        while next(tickets) < requests and time.monotonic() < deadline:
            rows, length = int(rng.integers(1, max_rows + 1)), int(rng.integers(lengths[0], lengths[1] + 1))
            head, blob = token_request(rng, rows, length, vocab)
            began = time.perf_counter()
            try:
                conn.request("POST", path, head + blob, {"Inference-Header-Content-Length": str(len(head))})
                response = conn.getresponse()
                body = response.read()
                error = _check(response, body, rows, length)
            except (OSError, http.client.HTTPException) as exc:
                error = f"{type(exc).__name__}: {exc}"
                conn.close()  # http.client reconnects on the next request
            load.record(rows, (time.perf_counter() - began) * 1000, error)
        conn.close()

    began = time.monotonic()
    threads = [threading.Thread(target=client, args=(i,), name=f"soak-client-{i}") for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    load.seconds = time.monotonic() - began
    return load


def _check(response: http.client.HTTPResponse, body: bytes, rows: int, length: int) -> str | None:
    """Why a reply is wrong, or None: HTTP 200 with `rows` rows, per-token outputs cut back to `length`."""
    if response.status != 200:
        return f"HTTP {response.status}: {body[:300]!r}"
    head = response.getheader("Inference-Header-Content-Length")
    shapes = [out["shape"] for out in json.loads(body[: int(head)] if head else body)["outputs"]]
    if any(shape[0] != rows or (len(shape) > 2 and shape[1] != length) for shape in shapes):
        return f"{rows} rows of length {length} got output shapes {shapes}"
    return None


class RssSampler(threading.Thread):
    """Samples a process's RSS every `every_s`, with its children's (the worker processes of `temper serve
    --instances`): (seconds since start, RSS bytes, requests done)."""

    def __init__(self, pid: int, every_s: float, progress: Callable[[], int]) -> None:
        super().__init__(name="soak-rss", daemon=True)
        self.process, self.every_s, self.progress = psutil.Process(pid), every_s, progress
        self.samples: list[tuple[float, int, int]] = []
        self.halt = threading.Event()
        self.began = time.monotonic()

    def run(self) -> None:
        while True:
            self.sample()
            if self.halt.wait(self.every_s):
                return

    def sample(self) -> None:
        rss = self.process.memory_info().rss
        for child in self.process.children(recursive=True):
            with contextlib.suppress(psutil.Error):  # a worker ending (restarted) between the listing and the read
                rss += child.memory_info().rss
        self.samples.append((time.monotonic() - self.began, rss, self.progress()))

    def stop(self) -> None:
        self.halt.set()
        self.join()
        self.sample()  # the end of the run, whatever the interval


def workers(pid: int) -> list[psutil.Process]:
    """The worker processes of the `temper serve` with this PID (artifacts/serving/workers.py starts them)."""
    found = []
    for child in psutil.Process(pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if "temper.artifacts.serving.worker" in " ".join(child.cmdline()):
                found.append(child)
    return found


@dataclass
class Kill:
    """One worker SIGKILLed during the soak, and how long the pool took to have every instance ready again."""

    at_s: float
    pid: int = 0
    instances: int = 0
    recovered_s: float | None = None


def ready_instances(port: int) -> float:
    """The sum of temper_model_instance_ready over the instances (one gauge each)."""
    status, body = request(port, "GET", "/metrics")
    found = re.findall(r"^temper_model_instance_ready\{[^}]*\} (\S+)$", body.decode(), flags=re.MULTILINE)
    return sum(float(value) for value in found) if status == 200 else 0.0


def kill_worker(server_pid: int, port: int, kill: Kill, began: float, halt: threading.Event) -> None:
    """At kill.at_s, SIGKILL the first worker; then poll /metrics until every instance is ready again."""
    if halt.wait(max(0.0, kill.at_s - (time.monotonic() - began))):
        return
    found = workers(server_pid)
    if not found:
        log("=== --kill-worker-at: the server has no worker processes (--instances 0?); nothing killed")
        return
    kill.instances, kill.pid = len(found), found[0].pid
    before = {w.pid for w in found}
    log(f"=== SIGKILL worker pid {kill.pid} ({kill.instances} instances) at {time.monotonic() - began:.1f} s")
    killed = time.monotonic()
    os.kill(kill.pid, signal.SIGKILL)
    # Recovered: the replacement worker exists (a PID not among the workers before: until then the pool may
    # not have seen the death, and the gauge may still read the dead instance as ready) and every instance
    # reports ready, which a replacement does only once it has loaded the model and warmed up.
    while not halt.is_set():
        replaced = any(w.pid not in before for w in workers(server_pid))
        if replaced and ready_instances(port) >= kill.instances:
            kill.recovered_s = time.monotonic() - killed
            return
        time.sleep(0.05)


def rss_after_warmup(samples: list[tuple[float, int, int]], warmup_fraction: float) -> tuple[float, int]:
    """(time, RSS) of the first sample after the first warmup_fraction of the run's duration."""
    cut = samples[-1][0] * warmup_fraction
    return next((t, rss) for t, rss, _ in samples if t >= cut)


# -- the serving soak ----------------------------------------------------------------------------


def soak(args: argparse.Namespace, base: Path) -> int:
    model = args.model or build_minilm(base, args.candidate)
    folder = make_bundle(model, base / "bundle")
    log(f"=== serving {folder} ({model})")
    load = Load()
    options = () if args.instances is None else ("--instances", args.instances)
    with serving(folder, base / "temper-serve.log", options=options) as (proc, port):
        before = counters(port)
        sampler = RssSampler(proc.pid, args.sample_s, lambda: load.done)
        sampler.start()
        kill = Kill(args.kill_worker_at) if args.kill_worker_at is not None else None
        halt = threading.Event()
        killer = threading.Thread(target=kill_worker, args=(proc.pid, port, kill, sampler.began, halt),
                                  daemon=True) if kill else None
        if killer:
            killer.start()
        run_load(port, "minilm", load, args.requests, args.seconds, args.clients, seed=args.seed)
        halt.set()
        if killer:
            killer.join()
        sampler.stop()
        after = counters(port)
    executions = after.get("nv_inference_exec_count", 0) - before.get("nv_inference_exec_count", 0)
    inferred = after.get("nv_inference_count", 0) - before.get("nv_inference_count", 0)
    warm_t, warm = rss_after_warmup(sampler.samples, args.warmup_fraction)
    end, peak = sampler.samples[-1][1], max(rss for _, rss, _ in sampler.samples)
    drift = end / warm - 1
    latency = np.percentile(load.latencies_ms, [50, 99]) if load.latencies_ms else [float("nan")] * 2
    plot_rss(sampler.samples, warm_t, warm, args.tolerance, args.png,
             f"temper serve MiniLM: {load.done:,} requests, batch 1-16, seq 8-128, {args.clients} clients")
    print(f"requests   {load.done:,} in {load.seconds:.0f} s ({load.done / load.seconds:,.0f}/s, "
          f"{load.rows / load.seconds:,.0f} rows/s)")
    print(f"errors     {load.errors}" + "".join(f"\n  {e}" for e in load.first_errors))
    lost_ok = True
    if kill:
        lost_ok = load.lost <= args.clients and kill.pid != 0 and kill.recovered_s is not None
        recovered = "never" if kill.recovered_s is None else f"in {kill.recovered_s:.2f} s"
        print(f"kill       worker pid {kill.pid} of {kill.instances} SIGKILLed at {kill.at_s:.0f} s: {load.lost} "
              f"request(s) lost to it (503, at most {args.clients} allowed); every instance ready again {recovered}")
    print(f"batches    {executions:,.0f} executions, {inferred / max(executions, 1):.1f} rows on average")
    print(f"RSS        {warm / MiB:,.0f} MiB after warm-up ({warm_t:.0f} s), {end / MiB:,.0f} MiB at the end "
          f"({drift:+.1%}), peak {peak / MiB:,.0f} MiB")
    print(f"latency    p50 {latency[0]:.1f} ms, p99 {latency[1]:.1f} ms")
    print(f"plot       {args.png}")
    flat = abs(drift) <= args.tolerance
    passed = flat and not load.errors and lost_ok
    print(f"verdict    {'PASS' if passed else 'FAIL'}: errors {load.errors}, "
          f"RSS {'flat' if flat else 'moved'} within +-{args.tolerance:.0%}"
          + (f", kill {'recovered' if lost_ok else 'NOT recovered'}" if kill else ""))
    return 0 if passed else 1


def plot_rss(samples: list[tuple[float, int, int]], warm_t: float, warm: int, tolerance: float, png: Path,
             title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    minutes = [t / 60 for t, _, _ in samples]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    ax.plot(minutes, [rss / MiB for _, rss, _ in samples], label="server RSS")
    ax.axvline(warm_t / 60, color="grey", linestyle="--", label="end of warm-up")
    ax.axhspan(warm * (1 - tolerance) / MiB, warm * (1 + tolerance) / MiB, color="green", alpha=0.1,
               label=f"+-{tolerance:.0%} of the warm RSS")
    ax.set(xlabel="minutes", ylabel="RSS (MiB)", title=title)
    ax.set_ylim(bottom=0)
    twin = ax.twinx()
    twin.plot(minutes, [done for _, _, done in samples], color="orange", alpha=0.5, label="requests done")
    twin.set_ylabel("requests done")
    ax.legend(loc="lower right")
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--model", type=Path, help="ONNX model with input_ids/attention_mask (default: build MiniLM)")
    add("--candidate", default="int8-dynamic", help="which MiniLM candidate to build and serve")
    add("--out-base", type=Path, help="folder for the build, bundle, logs, PNG (default: a new temp dir)")
    add("--requests", type=int, default=200_000, help="stop after this many requests")
    add("--seconds", type=float, default=4 * 3600, help="stop after this long (the arena check: per variant)")
    add("--clients", type=int, default=8, help="closed-loop client connections")
    add("--sample-s", type=float, default=5.0, help="seconds between RSS samples")
    add("--warmup-fraction", type=float, default=0.1, help="RSS is compared from this share of the run on")
    add("--tolerance", type=float, default=0.10, help="allowed RSS change after warm-up (0.10 = +-10%%)")
    add("--seed", type=int, default=0)
    add("--instances", help="temper serve --instances (default: its own); RSS counts the workers with the server")
    add("--kill-worker-at", type=float, help="SIGKILL one worker process this many seconds in (needs --instances >= 1)")
    add("--png", type=Path, help="where the plot goes (default: OUT_BASE/soak-rss.png or arena-rss.png)")
    add("--arena", action="store_true", help="compare ONNX Runtime memory options instead of serving")
    add("--runs", type=int, default=1500, help="session runs per variant in the arena check")
    add("--timing-runs", type=int, default=100, help="shapes timed on every variant, interleaved, in the arena check")
    add("--arena-child", help=argparse.SUPPRESS)  # comma-separated VARIANTS, run in this process
    args = parser.parse_args(argv)
    if args.arena_child:
        arena_child(args.model, args.arena_child.split(","), args.runs, args.seed)
        return 0
    if min(args.requests, args.clients, args.timing_runs) < 1 or args.seconds <= 0 or args.runs < 10:
        parser.error("--requests, --seconds, --clients, --timing-runs must be positive and --runs at least 10")
    base = (args.out_base or Path(tempfile.mkdtemp(prefix="temper-soak-"))).resolve()
    base.mkdir(parents=True, exist_ok=True)
    args.png = args.png or base / ("arena-rss.png" if args.arena else "soak-rss.png")
    log(f"outputs: {base}")
    return arena(args, base) if args.arena else soak(args, base)


if __name__ == "__main__":
    sys.exit(main())
