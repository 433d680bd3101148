"""One model's run in benchmarks/serving.py: (c), then every server at every concurrency, interleaved, then
the RSS check and (c) again, collected in a `ModelResult` for the report.

The order is the method: all servers stay up and the rows are measured side by side per
concurrency, with (c) right before them, so drifting machine speed and background load hit every
column alike; a level other work competed with is measured once more.
"""

from __future__ import annotations

import argparse
import os
from contextlib import ExitStack
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from benchmarks.serving_host import CpuMeter, log, wait_quiet
from benchmarks.serving_load import (
    Body,
    Point,
    check,
    grpc_load,
    measured,
    mlflow_body,
    temper_binary_body,
    temper_json_body,
    wrk,
)
from benchmarks.serving_models import Model, best, ceiling, make_bundle, reference
from benchmarks.serving_servers import Server, mlflow_server, plain_server, temper_server


@dataclass
class ModelResult:
    model: Model
    bundle_max_batch: int
    ceiling_before: dict[str, dict[int, float]]
    ceiling_after: dict[str, dict[int, float]] = field(default_factory=dict)
    ceiling_background: list[float] = field(default_factory=list)
    retried: int = 0
    restarts: dict[str, int] = field(default_factory=dict)
    adjacent: dict[int, float] = field(default_factory=dict)  # (c) at max_batch measured just before each concurrency
    rows: dict[tuple[str, int], Point] = field(default_factory=dict)
    rss: list[tuple[str, int, Point | None]] = field(default_factory=list)
    load: list[float] = field(default_factory=list)

    @property
    def ceiling(self) -> dict[int, float]:
        return best([self.ceiling_before, self.ceiling_after] if self.ceiling_after else [self.ceiling_before])

    @property
    def denominator(self) -> float:
        """The best (c) at max_batch_size seen anywhere in the run: before, after, or next to a concurrency."""
        return max([self.ceiling[self.bundle_max_batch], *self.adjacent.values()])


def bench_model(model: Model, args: argparse.Namespace, base: Path, rss_check: bool) -> ModelResult:
    log(f"=== {model.key}: (c) ONNX Runtime ceiling, {args.ceiling_duration:g} s per batch size")
    wait_quiet(args.max_wait)
    with CpuMeter() as meter:
        result = ModelResult(model, args.max_batch, ceiling(model, args.ceiling_duration))
    result.ceiling_background.append(meter.percent)
    model.batch1_ms = 1000 / best([result.ceiling_before])[1]
    log(f"  {result.ceiling_before} (background CPU {meter.percent:.0f}%)")
    bundle = make_bundle(model, base / "bundles" / model.key, args.max_batch, args.max_delay_ms)
    expected = reference(model)
    workdir = base / "wrk"
    workdir.mkdir(exist_ok=True)
    binary, v2_json, mlflow_json = temper_binary_body(model), temper_json_body(model), mlflow_body(model)
    grpc = not args.no_grpc

    def http(server: Server, body: Body, concurrency: int) -> Point:
        return measured(server, body.label, concurrency,
                        lambda: wrk(server.port, body, concurrency, args.duration, args.max_requests, workdir),
                        server is temper)

    with ExitStack() as stack:
        temper = stack.enter_context(temper_server(bundle, base, grpc))
        mlflow = stack.enter_context(mlflow_server(model, base))
        simple = stack.enter_context(plain_server(model, base)) if args.plain_concurrency else None
        grpc_port = temper.grpc_port
        result.rss.append(("after start (warm-up only)", temper.rss_kib(), None))
        check(temper, binary, expected)
        check(temper, v2_json, expected)
        check(mlflow, mlflow_json, expected)
        warm = [(temper, binary), (mlflow, mlflow_json)]
        if simple is not None:
            check(simple, binary, expected)
            check(simple, v2_json, expected)
            warm.append((simple, binary))
        for server, body in warm:  # warm every path, results dropped
            wrk(server.port, body, 8, 2, args.max_requests, workdir)
        if grpc_port is not None:  # checks the gRPC answer too
            grpc_load(grpc_port, model, expected, 8, 2, args.max_requests, workdir)
        for concurrency in args.concurrency:  # interleaved, so drifting background load hits every column alike
            for attempt in (1, 2):  # a point that other work competed with is measured once more
                wait_quiet(args.max_wait)
                result.load.append(os.getloadavg()[0])
                # (c) right before the points too: the machine's speed drifts over minutes (other VMs,
                # clocks) in ways no process here shows, and this one saw what the points saw.
                with CpuMeter() as meter:
                    near = ceiling(model, args.adjacent_duration, (args.max_batch,))
                result.adjacent[concurrency] = max(v[args.max_batch] for v in near.values())
                rows = {"a": http(temper, binary, concurrency)}
                if not args.no_json_rows:
                    rows["a-json"] = http(temper, v2_json, concurrency)
                if grpc_port is not None:
                    load = partial(grpc_load, grpc_port, model, expected, concurrency, args.duration,
                                   args.max_requests, workdir)
                    rows["a-grpc"] = measured(temper, "grpc", concurrency, load, True)
                if simple is not None and concurrency in args.plain_concurrency:
                    rows["p"] = http(simple, binary, concurrency)
                    if not args.no_json_rows:
                        rows["p-json"] = http(simple, v2_json, concurrency)
                rows["b"] = http(mlflow, mlflow_json, concurrency)
                noisy = max(p.background for p in rows.values())
                if noisy < args.noisy or attempt == 2:
                    break
                result.load.pop()
                log(f"  other processes used up to {noisy:.0f}% CPU during these points: "
                    f"measuring {concurrency} clients again")
            result.retried += attempt == 2
            for kind, point in rows.items():
                result.rows[(kind, concurrency)] = point
        result.restarts = {srv.name: srv.restarts for srv in (temper, mlflow, simple) if srv is not None}
        for other in (mlflow, simple):  # the RSS runs have the machine to themselves
            if other is not None:
                other.stop()
        if rss_check:
            result.rss.append(("after the benchmark points", temper.rss_kib(), None))
            for i in (1, 2):
                wait_quiet(args.max_wait)
                log(f"=== {model.key}: RSS check, run {i}: {args.rss_requests:,} requests at concurrency 32")
                point = wrk(temper.port, binary, 32, args.rss_timeout, args.rss_requests, workdir)
                result.rss.append((f"after {i * args.rss_requests // 1000}k more requests", temper.rss_kib(), point))
                log(f"  {point.requests:,} requests in {point.seconds:.1f} s, errors {point.errors}, "
                    f"VmRSS {result.rss[-1][1]:,} KiB")
    log(f"=== {model.key}: (c) again")
    wait_quiet(args.max_wait)
    with CpuMeter() as meter:
        result.ceiling_after = ceiling(model, args.ceiling_duration)
    result.ceiling_background.append(meter.percent)
    model.batch1_ms = 1000 / result.ceiling[1]
    log(f"  {result.ceiling_after} (background CPU {meter.percent:.0f}%)")
    return result
