"""What isolated inference workers (`temper serve --instances`) cost and how fast a crash is recovered.

    .venv/bin/python -m benchmarks.serving_workers [--out-base DIR] [--duration S] [--instances 0,auto]

Two models: a tiny MLP (1x64 -> 64 -> 10, microseconds per run: where the hand-off to a worker shows
most) and serving.py's heavy CNN (1x3x64x64, a few ms per batch-1 run). For each, `temper serve` runs
once per --instances value (0: the session in the server's process, as before workers; auto: the
default, usable cores over the model's intra-op threads; or a count), and wrk drives it closed-loop
with Triton's binary tensor body at 1 and 32 connections. Per point: req/s, p50, and the CPU the
gateway process used per request (psutil, the server process alone) against what its workers used.
The heavy CNN's points are also given as a ratio to the raw ONNX Runtime ceiling (serving_models'
(c): one in-process session at batch --max-batch, the better of spinning on and off, measured before
and after), the target being >= 0.8x at 32 clients with isolation on.

Crash recovery: the heavy CNN, for each --instances value that runs workers, under 32 wrk
connections; after --kill-after seconds its instance 0 worker is sent SIGKILL. /metrics' success
counter is sampled every 0.1 s; recovery is the time from the kill until a 0.5 s window's
throughput is back to 90 % of the mean before it. wrk's non-2xx answers are the requests the dead worker held (503).

Markdown goes to stdout, the host and its load first; progress to stderr.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import psutil

from benchmarks.serving_host import BIN, child_env, log, machine
from benchmarks.serving_load import Point, metrics, temper_binary_body, wrk
from benchmarks.serving_models import Model, build_heavy, ceiling, make_bundle, rounded_sample
from benchmarks.serving_servers import Server, free_port, request, start

ROOT = Path(__file__).resolve().parent.parent

SAMPLE_S = 0.1
WINDOW_S = 0.5
RECOVERED = 0.9


def build_tiny(base: Path) -> Model:
    """A seeded two-layer MLP, [batch, 64] -> [batch, 10]: a run costs microseconds."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    path = base / "tiny-mlp" / "model.onnx"
    if not path.is_file():
        rng = np.random.default_rng(0)
        inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32) / 8, n)
                 for n, s in (("W1", (64, 64)), ("B1", (64,)), ("W2", (64, 10)), ("B2", (10,)))]
        graph = helper.make_graph(
            [helper.make_node("Gemm", ["x", "W1", "B1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Gemm", ["r", "W2", "B2"], ["logits"])], "tiny",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
            [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])], inits)
        path.parent.mkdir(parents=True, exist_ok=True)
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    sample, values = rounded_sample((1, 64), 1.0)
    return Model("tiny", path, "x", sample, values, "MLP 64-64-10, seeded, 1x64")


def serve(bundle: Path, base: Path, instances: str) -> Server:
    port = free_port()
    cmd = [str(BIN / "temper"), "serve", str(bundle), "--port", str(port)]
    if instances != "auto":
        cmd += ["--instances", instances]
    return start(f"temper serve --instances {instances}", cmd, child_env(),
                 base / f"serve-{bundle.name}-{instances}.log", "/v2/health/ready", port)


def cpu_s(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def workers_of(server: Server) -> list[psutil.Process]:
    return [p for p in psutil.Process(server.proc.pid).children(recursive=True)
            if "temper.artifacts.serving.worker" in " ".join(p.cmdline())]


def point(server: Server, model: Model, concurrency: int, duration: float, workdir: Path) -> tuple[Point, float, float]:
    """One wrk point: the point, and the gateway's and the workers' CPU microseconds per answered request."""
    gateway, children = psutil.Process(server.proc.pid), workers_of(server)
    before = cpu_s(gateway), sum(cpu_s(c) for c in children)
    result = wrk(server.port, temper_binary_body(model), concurrency, duration, 10_000_000, workdir)
    after = cpu_s(gateway), sum(cpu_s(c) for c in children)
    answered = max(1, result.requests - result.errors)
    log(f"  c={concurrency}: {result.rps:,.0f} req/s p50 {result.p50_ms:.3f} ms errors {result.errors}")
    return result, (after[0] - before[0]) / answered * 1e6, (after[1] - before[1]) / answered * 1e6


def recovery(server: Server, model: Model, duration: float, kill_after: float, workdir: Path) -> dict[str, float]:
    """Kill instance 0's worker under 32-connection load; the time until throughput is back, and what was lost."""
    samples: list[tuple[float, float]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            samples.append((time.monotonic(), metrics(server.port)["nv_inference_request_success"]))
            time.sleep(SAMPLE_S)

    results: list[Point] = []
    load = threading.Thread(target=lambda: results.append(
        wrk(server.port, temper_binary_body(model), 32, duration, 10_000_000, workdir)))
    sampler = threading.Thread(target=sample)
    load.start()
    sampler.start()
    time.sleep(kill_after)
    victim = min(workers_of(server), key=lambda p: p.create_time())
    killed_at = time.monotonic()
    os.kill(victim.pid, signal.SIGKILL)
    load.join()
    done.set()
    sampler.join()

    def rate(t0: float, t1: float) -> float:
        inside = [(t, n) for t, n in samples if t0 <= t <= t1]
        return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0]) if len(inside) > 1 else 0.0

    steady = rate(samples[0][0] + 1.0, killed_at)
    back = next((t - killed_at for t, _ in samples if t >= killed_at and t + WINDOW_S <= samples[-1][0]
                 and rate(t, t + WINDOW_S) >= RECOVERED * steady), float("nan"))
    point = results[0]
    log(f"  steady {steady:,.0f} req/s before the kill; back to {RECOVERED:.0%} after {back:.2f}s; "
        f"{point.errors} non-2xx of {point.requests}")
    return {"steady": steady, "recovered_s": back, "lost": point.errors, "requests": point.requests}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-base", type=Path, help="folder for models, bundles and logs (default: a new temp dir)")
    parser.add_argument("--models", default="tiny,heavy")
    parser.add_argument("--instances", default="0,auto", help="comma-separated --instances values")
    parser.add_argument("--duration", type=float, default=8.0, help="seconds per load point")
    parser.add_argument("--max-batch", type=int, default=16)
    parser.add_argument("--max-delay-ms", type=float, default=10.0)
    parser.add_argument("--recovery-duration", type=float, default=16.0)
    parser.add_argument("--kill-after", type=float, default=6.0)
    args = parser.parse_args()
    base = args.out_base or Path(tempfile.mkdtemp(prefix="temper-workers-bench-"))
    base.mkdir(parents=True, exist_ok=True)
    info = machine()
    print(f"host: {info}; load before: {os.getloadavg()}\n")
    builders = {"tiny": build_tiny, "heavy": build_heavy}
    for key in args.models.split(","):
        model = builders[key](base)
        bundle = make_bundle(model, base / f"bundle-{key}", args.max_batch, args.max_delay_ms)
        measured_ceiling = [ceiling(model, 3.0, (args.max_batch,))] if key == "heavy" else []
        print(f"### {model.note}\n")
        print("| --instances | clients | req/s | p50 ms | errors | gateway CPU us/req | workers CPU us/req |"
              + (" vs ceiling |" if key == "heavy" else ""))
        print("|---|---|---|---|---|---|---|" + ("---|" if key == "heavy" else ""))
        rows, crashes = [], {}
        for instances in args.instances.split(","):
            server = serve(bundle, base, instances)
            info = [line for line in request(server.port, "GET", "/metrics")[2].decode().splitlines()
                    if line.startswith("temper_runtime_info{")]
            chosen = re.search(r'instances="(\d+)"', info[0]).group(1)  # type: ignore[union-attr]
            instances = instances if instances == chosen else f"{instances} (= {chosen})"
            try:
                for concurrency in (1, 32):
                    rows.append((instances, concurrency, *point(server, model, concurrency, args.duration, base)))
                if key == "heavy" and chosen != "0":
                    crashes[instances] = recovery(server, model, args.recovery_duration, args.kill_after, base)
            finally:
                server.stop()
        if key == "heavy":
            measured_ceiling.append(ceiling(model, 3.0, (args.max_batch,)))
            top = max(m[label][args.max_batch] for m in measured_ceiling for label in m)
        for instances, concurrency, p, gateway_us, workers_us in rows:
            print(f"| {instances} | {concurrency} | {p.rps:,.0f} | {p.p50_ms:.3f} | {p.errors} | {gateway_us:,.0f} | "
                  f"{workers_us:,.0f} |" + (f" {p.rps / top:.2f}x |" if key == "heavy" else ""))
        if key == "heavy":
            print(f"\nraw ONNX Runtime ceiling at batch {args.max_batch}: {top:,.0f} samples/s "
                  f"(best of {len(measured_ceiling)} runs, spinning on and off)")
            for instances, crash in crashes.items():
                print(f"\ncrash recovery (--instances {instances}, 32 connections, SIGKILL to instance 0 after "
                      f"{args.kill_after:.0f}s): steady {crash['steady']:,.0f} req/s, back to {RECOVERED:.0%} within "
                      f"{crash['recovered_s']:.2f}s; {crash['lost']:.0f} of {crash['requests']:.0f} requests "
                      "answered non-2xx")
        print()
    print(f"load after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
