"""Benchmark `temper serve` against `mlflow models serve`, a plain server and the raw ONNX Runtime ceiling.

    .venv/bin/python -m benchmarks.serving [--out-base DIR] [--duration S] [--concurrency 1,8,32,64] ...

Two models: the digits CNN (built by `temper run recipes/digits-cnn.yaml`, its FP32 baseline) and a
heavier seeded ResNet-ish CNN at 1x3x64x64 that takes a few ms per batch-1 inference here. Per model:

  (c)  in-process ONNX Runtime, no HTTP, at batch 1, 8, 16, 32: samples/s. Measured before and after
       the HTTP points; the higher of the two is the ceiling (the stricter denominator).
  (a)  `temper serve --grpc-port` on a bundle (artifacts.formats.bundle.config_for/write), the load generator
       sending Triton's binary tensor extension; (a-json) the same server with a plain KServe v2 JSON
       body; (a-grpc) the same server's gRPC port, ModelInfer with raw_input_contents.
  (p)  a plain server: the same HTTP stack (uvicorn, httptools, uvloop, a bare ASGI app) running one
       session.run per request, no batcher, taking the same binary and JSON bodies as (a): what the
       batcher costs or gains a lone client (--plain-concurrency, 1 by default).
  (b)  `mlflow models serve --env-manager local` on the same ONNX file logged with mlflow.onnx
       (a temp sqlite store), with mlflow's `{"inputs": {name: nested list}}` tensor body.

Load: HTTP with wrk (Debian package `wrk`), one thread, -c CONCURRENCY closed-loop connections on
127.0.0.1; gRPC with a Python grpc.aio client in its own process (one channel, CONCURRENCY calls in
flight, each reissuing a pre-built request as soon as its answer is in). Each point is bounded by
--duration seconds and --max-requests responses. Every req/s figure is also given as a ratio to (c)
at batch = the bundle's max_batch_size. The average formed batch comes from the server's /metrics
(nv_inference_count / nv_inference_exec_count deltas over the point). Finally the temper server's
VmRSS is read before and after --rss-requests requests at concurrency 32, twice.

Markdown goes to stdout (the host first, as artifacts.core.host.profile().summary() gives it); progress
and server logs to stderr / files under the output base.

This file is the command line; the parts live beside it, named for what they do: serving_host (the
machine, waits for quiet, the CPU meter), serving_models (the models, bundles, the (c) ceiling),
serving_servers (the servers under test, the plain server's code), serving_load (request bodies,
wrk, the gRPC client, one measured point), serving_run (one model's run, in order) and
serving_report (the Markdown). The helper processes are this script again, with a role first:
`--plain-server` (serving_servers.plain_server_main) and `--grpc-load` (serving_load.grpc_load_main).
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.serving_host import log, machine, top_processes, wait_for_quiet
from benchmarks.serving_load import grpc_load_main
from benchmarks.serving_models import CEILING_BATCHES, build_digits, build_heavy
from benchmarks.serving_report import header, summary, table, targets
from benchmarks.serving_run import bench_model
from benchmarks.serving_servers import plain_server_main

ROOT = Path(__file__).resolve().parent.parent

ROLES: dict[str, Callable[[list[str]], int]] = {"--plain-server": plain_server_main, "--grpc-load": grpc_load_main}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ROLES:  # this script started as one of its own helper processes
        return ROLES[argv[0]](argv[1:])
    # SIGTERM, like Ctrl-C, unwinds through the finally blocks that stop the servers (their own sessions:
    # neither signal reaches them from outside).
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-base", type=Path,
                        help="folder for models, bundles, stores and logs (default: a new temp dir, kept)")
    parser.add_argument("--models", default="digits,heavy", help="comma-separated: digits, heavy")
    parser.add_argument("--concurrency", default="1,8,32,64", help="closed-loop client counts")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per load point")
    parser.add_argument("--max-requests", type=int, default=500_000, help="responses per load point at most")
    parser.add_argument("--ceiling-duration", type=float, default=3.0, help="seconds per (c) batch size")
    parser.add_argument("--adjacent-duration", type=float, default=1.5,
                        help="seconds per spin setting for the (c) measured right before each concurrency")
    parser.add_argument("--max-batch", type=int, default=16,
                        help="bundles' max_batch_size, and (c)'s denominator batch")
    parser.add_argument("--max-delay-ms", type=float, default=10.0, help="bundles' max_delay_ms")
    parser.add_argument("--rss-model", default="digits",
                        help="model whose temper server gets the RSS check ('' = none)")
    parser.add_argument("--rss-requests", type=int, default=100_000, help="requests per RSS run (two runs)")
    parser.add_argument("--rss-timeout", type=float, default=300.0, help="seconds an RSS run may take at most")
    parser.add_argument("--no-json-rows", action="store_true", help="skip the rows with a KServe v2 JSON body")
    parser.add_argument("--no-grpc", action="store_true", help="skip the temper-over-gRPC rows")
    parser.add_argument("--plain-concurrency", default="1",
                        help="client counts at which to measure the plain server too, those in --concurrency "
                             "('' = none)")
    parser.add_argument("--load-threshold", type=float, default=1.5,
                        help="1-min load average to wait for before starting")
    parser.add_argument("--max-wait", type=float, default=300.0,
                        help="seconds to wait, each time, for the load to drop / other processes to go quiet")
    parser.add_argument("--noisy", type=float, default=25.0,
                        help="re-measure a concurrency once when other processes used more than this %% CPU during it")
    args = parser.parse_args(argv)
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    args.plain_concurrency = [c for c in map(int, filter(str.strip, args.plain_concurrency.split(",")))
                              if c in args.concurrency]
    if args.max_batch not in CEILING_BATCHES:
        parser.error(f"--max-batch must be one of {CEILING_BATCHES} (the batch sizes (c) measures)")
    if shutil.which("wrk") is None:
        print("error: wrk not found; install it (Debian: apt-get install -y wrk)", file=sys.stderr)
        return 3
    if not args.no_grpc:
        try:
            import grpc  # noqa: F401
            from tritonclient.grpc import service_pb2  # noqa: F401
        except (ImportError, RuntimeError) as exc:  # tritonclient reports a missing grpcio as a RuntimeError
            print(f"error: the gRPC rows need the grpc extra (pip install 'temper-ml[grpc]'), or pass --no-grpc: {exc}",
                  file=sys.stderr)
            return 3
    began = time.monotonic()
    base = (args.out_base or Path(tempfile.mkdtemp(prefix="temper-serving-bench-"))).resolve()
    base.mkdir(parents=True, exist_ok=True)
    log(f"outputs: {base}")
    info = machine()
    from temper.artifacts.core.host import profile

    host = profile().summary()
    log(f"host: {host}")

    builders = {"digits": build_digits, "heavy": build_heavy}
    models = [builders[key.strip()](base) for key in args.models.split(",") if key.strip()]
    asked, load, waited = wait_for_quiet(args.load_threshold, args.max_wait)
    busy = top_processes()
    results = {}
    for model in models:
        results[model.key] = bench_model(model, args, base, model.key == args.rss_model)

    print(header(host, info, args, asked, load, waited, busy))
    for result in results.values():
        print(table(result, args, info["cores"]) + "\n")
    print(targets(results, args) + "\n")
    print(summary(results, args))
    log(f"done in {(time.monotonic() - began) / 60:.1f} min; outputs in {base}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # the servers were stopped on the way out
        print("interrupted", file=sys.stderr)
        sys.exit(130)
