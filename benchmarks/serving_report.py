"""The Markdown benchmarks/serving.py prints: the header, one table per model, the targets, the summary.

Formatting only: everything here reads a finished `ModelResult` and the run's options, and
measures nothing.
"""

from __future__ import annotations

import argparse
from typing import Any

from benchmarks.serving_models import CEILING_BATCHES
from benchmarks.serving_run import ModelResult

LABELS = {"a": "(a) temper serve, binary", "a-json": "(a) temper serve, JSON", "a-grpc": "(a) temper serve, gRPC",
          "p": "(p) plain server, binary", "p-json": "(p) plain server, JSON", "b": "(b) mlflow models serve"}


def ratio(x: float, y: float) -> str:
    return f"{x / y:.2f}x" if y else ""


def table(result: ModelResult, args: argparse.Namespace, cores: int) -> str:
    """One model's section: the points, the one-client line, (c), RSS and the load notes."""
    m = result.model
    denom = result.denominator
    near_values = ", ".join(f"{c} clients {v:,.0f}" for c, v in result.adjacent.items())
    lines = [f"### {m.key}: {m.note}", "",
             f"Batch-1 ONNX Runtime latency {m.batch1_ms:.3f} ms. Bundle: max_batch_size {result.bundle_max_batch}, "
             f"max_delay_ms {args.max_delay_ms:g}. Ratios are to (c) at batch {result.bundle_max_batch} = "
             f"{denom:,.0f} samples/s, the best (c) at that batch anywhere in this run. `x (c) near`: ratio to (c) "
             f"at batch {result.bundle_max_batch} measured right before that concurrency's points ({near_values} "
             "samples/s), which saw the same machine speed as the points. `x (b)`: req/s over (b)'s at the same "
             "concurrency. `bg CPU`: CPU used during the point by every process but the server measured and the "
             "load generator (the other, idle servers included; % of one core; above ~10% means other work "
             "competed with the measurement).", "",
             "| server | clients | req/s | ratio to (c) | x (c) near | x (b) | p50 ms | p99 ms | errors | avg batch "
             "| bg CPU |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for kind in LABELS:
        for c in args.concurrency:
            p = result.rows.get((kind, c))
            if p is None:
                continue
            vs_b = ratio(p.rps, result.rows[("b", c)].rps) if kind != "b" else ""
            errors = str(p.errors) + (f" ({', '.join(f'{k} {v}' for k, v in p.error_kinds.items())})"
                                      if p.errors else "")
            batch = f"{p.avg_batch:.2f}" if p.avg_batch is not None else ""
            near = ratio(p.rps, result.adjacent[c]) if result.adjacent.get(c) else ""
            lines.append(f"| {LABELS[kind]} | {c} | {p.rps:,.0f} | {p.rps / denom:.2f}x | {near} | {vs_b} | "
                         f"{p.p50_ms:.2f} | {p.p99_ms:.2f} | {errors} | {batch} | {p.background:.0f}% |")
    lone = lone_client(result)
    if lone:
        lines += ["", "One client, p50: " + lone + "."]
    bg = " / ".join(f"{x:.0f}%" for x in result.ceiling_background)
    lines += ["", (f"(c) in-process ONNX Runtime, {cores} intra-op threads, no HTTP, samples/s; "
                   "ORT's default spinning intra-op threads and spinning off (as temper's runtime runs), each before "
                   f"and after the HTTP points (bg CPU {bg}); the ceiling is the best of the four:"), "",
              "| batch | spin, before | no spin, before | spin, after | no spin, after | ceiling |",
              "|---:|---:|---:|---:|---:|---:|"]
    for b in CEILING_BATCHES:
        mark = " **(denominator)**" if b == result.bundle_max_batch else ""
        cells = " | ".join(f"{m[label][b]:,.0f}" for m in (result.ceiling_before, result.ceiling_after)
                           for label in ("spin", "no spin"))
        lines.append(f"| {b}{mark} | {cells} | {result.ceiling[b]:,.0f} |")
    if result.rss:
        lines += ["", "RSS of the temper server (VmRSS):", ""]
        first = result.rss[0][1]
        for label, kib, point in result.rss:
            extra = (f" ({point.requests:,} requests in {point.seconds:.0f} s = {point.rps:,.0f} req/s, "
                     f"errors {point.errors})") if point else ""
            lines.append(f"- {label}: {kib / 1024:.1f} MiB ({(kib - first) / 1024:+.1f} MiB){extra}")
    lines += ["", "1-min load average at each concurrency's start (it counts the benchmark's own processes): "
              + ", ".join(f"{c} clients {x:.2f}" for c, x in zip(args.concurrency, result.load)) + "."
              + (f" {result.retried} concurrency level(s) were measured twice because other processes used more "
                 f"than {args.noisy:g}% CPU the first time; the table shows the second measurement."
                 if result.retried else "")
              + "".join(f" {name} had gone away and was restarted {n} time(s) between points."
                        for name, n in result.restarts.items() if n)]
    return "\n".join(lines)


def lone_client(result: ModelResult) -> str:
    """temper's p50 at one client beside the plain server's: what the runtime costs or gains a lone client."""
    parts = []
    for kind, plain_kind, label in (("a", "p", "binary"), ("a-json", "p-json", "JSON")):
        a, p = result.rows.get((kind, 1)), result.rows.get((plain_kind, 1))
        if a and p:
            parts.append(f"{label}: temper {a.p50_ms:.2f} ms, plain server {p.p50_ms:.2f} ms "
                         f"({a.p50_ms - p.p50_ms:+.2f} ms, {a.p50_ms / p.p50_ms:.2f}x)")
    grpc = result.rows.get(("a-grpc", 1))
    if grpc:
        parts.append(f"gRPC: temper {grpc.p50_ms:.2f} ms")
    return "; ".join(parts)


def targets(results: dict[str, ModelResult], args: argparse.Namespace) -> str:
    """The issue's goals, met or missed: heavy >= 0.8x (c) and >= 2x (b) at >= 32 clients, digits >= 3x (b),
    RSS flat; the gRPC and one-client figures beside them, with no target."""
    lines = ["### Targets", ""]

    def verdict(ok: bool) -> str:
        return "met" if ok else "**missed**"

    heavy = results.get("heavy")
    if heavy:
        for c in [c for c in args.concurrency if c >= 32]:
            a, b = heavy.rows[("a", c)], heavy.rows[("b", c)]
            ra, rb = a.rps / heavy.denominator, a.rps / b.rps if b.rps else float("inf")
            near = a.rps / heavy.adjacent[c] if heavy.adjacent.get(c) else float("nan")
            lines.append(f"- heavy, {c} clients: temper {ra:.2f}x of (c) (target >= 0.8: {verdict(ra >= 0.8)}; "
                         f"{near:.2f}x of the (c) measured next to it), "
                         f"{rb:.2f}x of (b) (target >= 2: {verdict(rb >= 2)})")
            g = heavy.rows.get(("a-grpc", c))
            if g:
                lines.append(f"- heavy, {c} clients, gRPC (no target): temper {g.rps / heavy.denominator:.2f}x of (c), "
                             f"{g.rps / a.rps:.2f}x of its own HTTP binary figure")
    digits = results.get("digits")
    if digits:
        for c in args.concurrency:
            a, b = digits.rows[("a", c)], digits.rows[("b", c)]
            rb = a.rps / b.rps if b.rps else float("inf")
            g = digits.rows.get(("a-grpc", c))
            grpc = f"; gRPC {g.rps / b.rps:.2f}x (no target)" if g and b.rps else ""
            lines.append(f"- digits, {c} clients: temper (binary) {rb:.2f}x of (b) (target >= 3: {verdict(rb >= 3)})"
                         + grpc)
    for key, result in results.items():
        lone = lone_client(result)
        if lone:
            lines.append(f"- {key}, one client, p50 against the plain server (no target): {lone}")
    for key, result in results.items():
        if len(result.rss) >= 4:
            (_, r1, _), (_, r2, _) = result.rss[-2], result.rss[-1]
            growth = (r2 - r1) / 1024
            lines.append(f"- {key}: RSS over the second {args.rss_requests // 1000}k requests {growth:+.1f} MiB "
                         f"({verdict(abs(growth) < 5)}: flat means within 5 MiB)")
    return "\n".join(lines)


def summary(results: dict[str, ModelResult], args: argparse.Namespace) -> str:
    """The short tables docs/benchmarks.md shows."""
    lines = ["### Summary", "",
             "| model | clients | HTTP binary req/s | x (c) | x (b) | p50 ms | p99 ms | avg batch | gRPC req/s "
             "| gRPC x (c) | gRPC p50 ms | gRPC p99 ms | (b) req/s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for key, result in results.items():
        name = f"{key} ({result.model.batch1_ms:.3g} ms/inference)"
        for c in args.concurrency:
            a, b, g = result.rows[("a", c)], result.rows[("b", c)], result.rows.get(("a-grpc", c))
            grpc = (f"{g.rps:,.0f} | {g.rps / result.denominator:.2f}x | {g.p50_ms:.2f} | {g.p99_ms:.3g}" if g
                    else " | | | ")
            batch = f"{a.avg_batch:.2f}" if a.avg_batch is not None else ""
            lines.append(f"| {name} | {c} | {a.rps:,.0f} | {a.rps / result.denominator:.2f}x | {ratio(a.rps, b.rps)} | "
                         f"{a.p50_ms:.2f} | {a.p99_ms:.3g} | {batch} | {grpc} | {b.rps:,.0f} |")
            name = key
    lone = [(key, r) for key, r in results.items() if ("p", 1) in r.rows]
    if lone:
        lines += ["", "| model, 1 client | temper binary p50 ms | plain binary p50 ms | temper JSON p50 ms "
                      "| plain JSON p50 ms | temper gRPC p50 ms | (b) p50 ms |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for key, r in lone:
            cells = [r.rows.get((kind, 1)) for kind in ("a", "p", "a-json", "p-json", "a-grpc", "b")]
            lines.append(f"| {key} | " + " | ".join(f"{p.p50_ms:.2f}" if p else "" for p in cells) + " |")
    return "\n".join(lines)


def header(host: str, info: dict[str, Any], args: argparse.Namespace, asked: float, load: float, waited: float,
           busy: str) -> str:
    """The run's heading: the host, the machine and versions, the load generators, the load when it began."""
    i = info
    grpc = ("" if args.no_grpc else " gRPC: a Python grpc.aio client in its own process, one channel, CONCURRENCY "
            "ModelInfer calls in flight, each resending a pre-built raw-tensor request on its answer.")
    return (f"## Serving benchmark\n\n**Host:** {host}\n\n**Machine:** {i['cpu']}, {i['cores']} cores, "
            f"onnxruntime {i['ort']}, mlflow {i['mlflow']}, Python {i['python']}, {i['date']}. Load generators: HTTP: "
            f"wrk, 1 thread, closed loop on 127.0.0.1.{grpc} {args.duration:g} s per point (at most "
            f"{args.max_requests:,} requests). 1-min load average {asked:.2f} when started, {load:.2f} when measuring "
            f"began (waited {waited:.0f} s; busiest processes then: {busy}); the clients share the {i['cores']} cores "
            "with the server.\n")
