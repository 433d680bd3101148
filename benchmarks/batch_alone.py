"""What serving a batch-dependent model one request per batch costs (issue 37.1).

    .venv/bin/python -m benchmarks.batch_alone OUTPUT/int8-dynamic [--duration S] [--rounds N] [--conns 1,8,32]

The same model (a run's candidate folder, e.g. the digits recipe's int8-dynamic) is served by `temper serve` twice,
from two bundles that differ only in runtime.json `batch_dependent`: false (the batcher joins concurrent
requests, so one client's rows move another's answer) and true (one request per batch). A closed-loop Python
client (benchmarks/pyload.py: no wrk needed) drives each with Triton's binary tensor body (one row: zeros with
a 1 in the middle) at each connection count; the two servers alternate round by round, so drift on a shared
host hits both alike. Per point: req/s and p99 per round, the median, and the ratio isolated / shared.

Markdown goes to stdout, the host first; progress to stderr.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

from benchmarks.pyload import Run, closed
from benchmarks.serving_host import BIN, child_env, log, machine
from benchmarks.serving_load import Body
from benchmarks.serving_servers import free_port, start
from temper.artifacts.formats import bundle

ROOT = Path(__file__).resolve().parent.parent

KINDS = {"float32": ("FP32", "<f4"), "int64": ("INT64", "<i8"), "int32": ("INT32", "<i4")}


def body_for(config: bundle.ServingConfig) -> Body:
    """One row of each input (zeros, dynamic dims 8 long, a 1 in the middle of float inputs) as binary data."""
    parts, inputs = [], []
    for spec in config.inputs:
        shape = [1 if axis == spec.batch_axis else (d if d > 0 else 8) for axis, d in enumerate(spec.shape)]
        datatype, dtype = KINDS[spec.dtype]
        array = np.zeros(shape, dtype=dtype)
        if spec.dtype == "float32":
            array.flat[array.size // 2] = 1.0
        else:
            array[...] = 1
        data = array.tobytes()
        parts.append(data)
        inputs.append({"name": spec.name, "shape": shape, "datatype": datatype,
                       "parameters": {"binary_data_size": len(data)}})
    head = json.dumps({"inputs": inputs, "parameters": {"binary_data_output": True}}, separators=(",", ":")).encode()
    return Body("binary", f"/v2/models/{config.name}/infer", head + b"".join(parts),
                {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(head))})


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("candidate", type=Path, help="a run's candidate folder (OUTPUT/NAME), or a serving bundle")
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--conns", default="1,8,32")
    parser.add_argument("--max-batch", type=int, default=16)
    args = parser.parse_args(argv)
    conns = [int(c) for c in args.conns.split(",")]
    model = args.candidate / bundle.MODEL
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        servers, body = {}, None
        for label, dependent in (("shared", False), ("alone", True)):
            config = bundle.config_for(model, "m", max_batch_size=args.max_batch, batch_dependent=dependent)
            folder = bundle.write(base / label, model, config)
            body = body_for(config)
            port = free_port()
            servers[label] = start(f"temper serve ({label})", [str(BIN / "temper"), "serve", str(folder), "--port",
                                   str(port)], child_env(), base / f"{label}.log", "/v2/health/ready", port)
        assert body is not None
        points: dict[tuple[str, int], list[Run]] = {}
        try:
            for c in conns:
                for r in range(args.rounds):
                    for label, server in servers.items():
                        point = closed(server.port, body, c, args.duration)
                        log(f"  {label} c={c} round {r}: {point.rps:.0f} req/s p99 {point.p(99):.2f} ms")
                        points.setdefault((label, c), []).append(point)
        finally:
            for server in servers.values():
                server.stop()
    host = machine()
    print(f"Host: {host['cpu']}, {host['cores']} usable cores, onnxruntime {host['ort']}, {host['date']}; "
          f"model {args.candidate}, {args.rounds} rounds of {args.duration:g} s, interleaved\n")
    print("| connections | shared req/s | alone req/s | alone / shared | shared p99 ms | alone p99 ms |")
    print("|---|---|---|---|---|---|")
    for c in conns:
        shared = statistics.median(p.rps for p in points["shared", c])
        alone = statistics.median(p.rps for p in points["alone", c])
        p99s = [statistics.median(p.p(99) for p in points[label, c]) for label in ("shared", "alone")]
        print(f"| {c} | {shared:,.0f} | {alone:,.0f} | {alone / shared:.2f}x | {p99s[0]:.2f} | {p99s[1]:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
