"""What isolating the model in a worker process costs against running it in the server's process (issue 37: "the
isolation's cost against inline (about 9 % fewer requests/s measured)").

    HF_HUB_OFFLINE=1 .venv/bin/python -m benchmarks.isolation_cost OUTPUT/baseline [--duration 8] [--rounds 3]

One bundle (the candidate's model, `--max-batch`, 10 ms delay, not batch-dependent so the batcher joins requests)
is served by two `temper serve` processes at once: `--instances 0` (the session in the server's process) and
`--instances 1` (one isolated worker, its tensors through shared memory: artifacts/serving/workers.py). The same
closed-loop Python client (benchmarks/pyload.py) drives each with Triton's binary body (one row; token inputs 8
long) at each connection count; the servers alternate within each round, so drift on a shared host hits both.
Per point: the median req/s and p50 over the rounds, and the ratio worker / in-process.

Markdown on stdout (host, load average and date first); progress on stderr.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

from benchmarks.batch_alone import body_for
from benchmarks.pyload import Run, closed
from benchmarks.serving_host import BIN, child_env, log, machine
from benchmarks.serving_servers import free_port, start
from temper.artifacts.formats import bundle

MODES = {"in-process": "0", "worker": "1"}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("candidate", type=Path, help="a run's candidate folder (OUTPUT/NAME) or a model.onnx's folder")
    parser.add_argument("--duration", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--conns", default="1,16")
    parser.add_argument("--max-batch", type=int, default=32)
    args = parser.parse_args(argv)
    conns = [int(c) for c in args.conns.split(",")]
    model = args.candidate / bundle.MODEL
    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        config = bundle.config_for(model, "m", max_batch_size=args.max_batch, max_delay_ms=10)
        folder = bundle.write(base / "bundle", model, config)
        body = body_for(config)
        servers = {}
        try:
            for label, instances in MODES.items():
                port = free_port()
                servers[label] = start(f"temper serve ({label})", [str(BIN / "temper"), "serve", str(folder), "--port",
                                       str(port), "--instances", instances], child_env(), base / f"{label}.log",
                                       "/v2/health/ready", port)
            points: dict[tuple[str, int], list[Run]] = {}
            for server in servers.values():
                closed(server.port, body, max(conns), 2.0)  # warm: every batch size the load makes
            for r in range(args.rounds):
                for c in conns:
                    order = list(servers.items()) if r % 2 == 0 else list(reversed(servers.items()))
                    for label, server in order:
                        point = closed(server.port, body, c, args.duration)
                        log(f"  {label} c={c} round {r}: {point.rps:.1f} req/s p50 {point.p(50):.2f} ms")
                        points.setdefault((label, c), []).append(point)
                load.append(os.getloadavg()[0])
        finally:
            for server in servers.values():
                server.stop()
    host = machine()
    print(f"Host: {host['cpu']}, {host['cores']} usable cores, onnxruntime {host['ort']}, {host['date']}; load "
          f"average {min(load):.1f}-{max(load):.1f} (1 min, between rounds); model {args.candidate}, max batch "
          f"{args.max_batch}; {args.rounds} rounds of {args.duration:g} s per point, the two servers alternating\n")
    print("| connections | in-process req/s | worker req/s | worker / in-process (per round) | in-process p50 ms | "
          "worker p50 ms |")
    print("|---|---|---|---|---|---|")
    for c in conns:
        inline = [p.rps for p in points["in-process", c]]
        worker = [p.rps for p in points["worker", c]]
        ratios = ", ".join(f"{w / i:.2f}" for w, i in zip(worker, inline, strict=True))
        p50 = [statistics.median(p.p(50) for p in points[label, c]) for label in MODES]
        print(f"| {c} | {statistics.median(inline):,.1f} | {statistics.median(worker):,.1f} | "
              f"{statistics.median(worker) / statistics.median(inline):.2f}x ({ratios}) | {p50[0]:.2f} | "
              f"{p50[1]:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
