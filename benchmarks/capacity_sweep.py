"""`temper capacity` against a hand sweep with perf_analyzer over the same grid (issue 37: "the capacity command's
chosen configuration against a hand sweep with perf_analyzer (same or better rate at the target)").

    .venv/bin/python -m benchmarks.capacity_sweep OUTPUT/int8-static --p99-ms 10      # about 6 minutes here

1. `temper capacity` (the console script, as a user runs it) on a bundle of the candidate (a run's model folder
   gets the serving options publishing would give it), over `--batch-sizes` x `--delays-ms` x `--instances`.
2. The hand sweep: every configuration of the same grid (the full product: no pruning, no one-dimension-at-a-time),
   each on a fresh `temper serve --instances N` of a copy of the bundle with that batching, found the way one
   would by hand with perf_analyzer: one open-loop run per rate (Poisson, `--request-count` = `--seconds` of
   requests, at least 50), doubling from `--start-rate` until a rate breaks the target, then `--steps` geometric
   bisections. A rate is under the target when perf_analyzer's own p99 (its CSV) is at most the target, it
   exited 0, and it sent at most 5% of the requests late (its own warning): the rule capacity applies, read from
   perf_analyzer's output instead of temper's code. `--pa-args` adds perf_analyzer options (e.g. `--async`) to
   the sweep only.
3. When capacity chose another configuration than the sweep's best, both are measured again, alternately, each
   `--rounds` times on a fresh server with the sweep's procedure: the ratio of their knees (median) is the verdict,
   measured side by side so host drift hits both.

Markdown on stdout (host, load average, date first); progress on stderr.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.serving_host import BIN, ROOT, child_env, log, machine
from benchmarks.serving_servers import free_port, start
from temper.artifacts.formats import bundle, capacity

PA = ROOT / ".cache" / "perf_analyzer" / "run"
LATE_PCT = 5.0


@dataclass(frozen=True)
class Config:
    batch: int
    delay: float
    instances: int

    def label(self) -> str:
        return f"b{self.batch} d{self.delay:g} i{self.instances}"


@dataclass
class Rate:
    rate: float
    p99_ms: float | None
    late_pct: float
    under: bool

    def why(self, target: float) -> str:
        if self.p99_ms is None:
            return "failed"
        return "late" if self.late_pct > LATE_PCT else ("p99" if self.p99_ms > target else "")


def staged(source: Path, dest: Path) -> Path:
    """A serving bundle of `source`: itself when it is one, else the run's model with publishing's options."""
    if (source / bundle.CONFIG).is_file():
        return Path(shutil.copytree(source, dest))
    from temper.pipeline.outputs import servable

    folder, config = servable(source)
    return bundle.write(dest, folder / bundle.MODEL, config)


def offer(pa: str, name: str, port: int, rate: float, target: float, seconds: float, extra: list[str],
          tmp: Path) -> Rate:
    """One perf_analyzer run at `rate`, judged from perf_analyzer's own CSV and warnings."""
    count = max(50, math.ceil(rate * seconds))
    table = tmp / "pa.csv"
    table.unlink(missing_ok=True)
    args = [pa, "-m", name, "-u", f"127.0.0.1:{port}", "-i", "http", "--request-rate-range",
            f"{rate:.3f}:{rate:.3f}:1", "--request-distribution", "poisson", "--request-count", str(count),
            "--percentile=99", "-f", str(table), *extra]
    try:
        run = subprocess.run(args, capture_output=True, text=True, timeout=count / rate * 4 + 60)
        said, code = run.stdout + run.stderr, run.returncode
    except subprocess.TimeoutExpired:
        said, code = "", -1
    late = re.search(r"([0-9.]+)% of the requests were delayed", said)
    p99 = None
    if code == 0 and table.is_file():
        rows = table.read_text().splitlines()
        if len(rows) > 1:
            p99 = float(dict(zip(rows[0].split(","), rows[-1].split(","), strict=False))["p99 latency"]) / 1000
    late_pct = float(late.group(1)) if late else 0.0
    return Rate(rate, p99, late_pct, p99 is not None and p99 <= target and late_pct <= LATE_PCT)


def knee(pa: str, source: Path, config: Config, args: argparse.Namespace, tmp: Path) -> tuple[float, list[Rate]]:
    """The highest rate under the target on a fresh server of `config`: doubling, then geometric bisections."""
    base = bundle.read(source)
    folder = tmp / f"{config.label().replace(' ', '-')}-{time.monotonic_ns()}"
    bundle.write(folder, source / bundle.MODEL, base.model_copy(update={
        "max_batch_size": config.batch, "max_delay_ms": config.delay}))
    port = free_port()
    server = start(f"temper serve {config.label()}", [str(BIN / "temper"), "serve", str(folder), "--port", str(port),
                   "--instances", str(config.instances)], child_env(), folder.with_suffix(".log"),
                   "/v2/health/ready", port)
    rates: list[Rate] = []

    def at(rate: float) -> bool:
        point = offer(pa, base.name, port, rate, args.p99_ms, args.seconds, args.pa_args.split(), tmp)
        rates.append(point)
        log(f"  {config.label()}: {rate:,.1f}/s p99 {point.p99_ms} late {point.late_pct:g}%: "
            f"{'under' if point.under else 'OVER ' + point.why(args.p99_ms)}")
        return point.under

    try:
        low, high, rate = 0.0, 0.0, args.start_rate
        while rate <= args.max_rate:
            if not at(rate):
                high = rate
                break
            low, rate = rate, rate * 2
        while low == 0.0 and rate >= 1.0:  # the start rate was over: halve until one is under
            rate /= 2
            if at(rate):
                low = rate
            else:
                high = rate
        if low and high:
            for _ in range(args.steps):
                middle = math.sqrt(low * high)
                low, high = (middle, high) if at(middle) else (low, middle)
    finally:
        server.stop()
    return low, rates


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("candidate", type=Path, help="a serving bundle, or a run's model folder (OUTPUT/NAME)")
    parser.add_argument("--p99-ms", type=float, default=10.0)
    parser.add_argument("--batch-sizes", default="16,4")
    parser.add_argument("--delays-ms", default="2,0")
    parser.add_argument("--instances", default="1,2")
    parser.add_argument("--seconds", type=float, default=2.0, help="seconds of requests per rate (both sides)")
    parser.add_argument("--start-rate", type=float, default=250.0)
    parser.add_argument("--max-rate", type=float, default=20_000.0)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2, help="capacity's repeats, and the head-to-head's rounds")
    parser.add_argument("--perf-analyzer", default=str(PA))
    parser.add_argument("--pa-args", default="", help="extra perf_analyzer options for the hand sweep")
    parser.add_argument("--keep", type=Path, help="copy capacity.json and capacity.png here")
    args = parser.parse_args(argv)
    grid = [Config(b, d, i) for b, d, i in itertools.product(
        [int(v) for v in args.batch_sizes.split(",")], [float(v) for v in args.delays_ms.split(",")],
        [int(v) for v in args.instances.split(",")])]
    load = [os.getloadavg()[0]]
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="capacity-sweep-") as name:
        tmp = Path(name)
        source = staged(args.candidate, tmp / "bundle")
        measured = staged(source, tmp / "measured")
        log(f"=== temper capacity {measured} over {len(grid)} configurations")
        t0 = time.monotonic()
        run = subprocess.run([str(BIN / "temper"), "capacity", str(measured), "--p99-ms", str(args.p99_ms),
                              "--batch-sizes", args.batch_sizes, "--delays-ms", args.delays_ms, "--instances",
                              args.instances, "--rounds", str(args.rounds), "--seconds", str(args.seconds),
                              "--steps", str(args.steps), "--start-rate", str(args.start_rate), "--max-rate",
                              str(args.max_rate), "--perf-analyzer", args.perf_analyzer],
                             env=child_env(), stdout=subprocess.DEVNULL, stderr=sys.stderr, check=False)
        capacity_s = time.monotonic() - t0
        record = capacity.read(measured)
        if run.returncode != 0 or record is None:
            raise SystemExit(f"error: temper capacity exited {run.returncode}")
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
            for item in (capacity.CAPACITY, capacity.PLOT):
                shutil.copy2(measured / item, args.keep / item)
        chosen = Config(record.chosen.max_batch_size, record.chosen.max_delay_ms, record.chosen.instances)
        load.append(os.getloadavg()[0])
        log(f"=== hand sweep: {len(grid)} configurations")
        t0 = time.monotonic()
        sweep = {config: knee(args.perf_analyzer, source, config, args, tmp) for config in grid}
        sweep_s = time.monotonic() - t0
        load.append(os.getloadavg()[0])
        best = max(grid, key=lambda c: sweep[c][0])
        rounds: dict[Config, list[float]] = {chosen: [], best: []}
        if best != chosen:
            log(f"=== head to head: {chosen.label()} (capacity) vs {best.label()} (sweep), {args.rounds} rounds")
            for _ in range(args.rounds):
                for config in (chosen, best):
                    rounds[config].append(knee(args.perf_analyzer, source, config, args, tmp)[0])
        load.append(os.getloadavg()[0])
    report(args, grid, record, chosen, capacity_s, sweep, sweep_s, best, rounds, load, time.monotonic() - began)
    return 0


def report(args: argparse.Namespace, grid: list[Config], record: capacity.Capacity, chosen: Config, capacity_s: float,
           sweep: dict[Config, tuple[float, list[Rate]]], sweep_s: float, best: Config,
           rounds: dict[Config, list[float]], load: list[float], wall_s: float) -> None:
    host = machine()
    print(f"Host: {host['cpu']}, {host['cores']} usable cores, onnxruntime {host['ort']}, {host['date']}; 1-min load "
          f"average {' / '.join(f'{v:.2f}' for v in load)} (start / after capacity / after the sweep / end); "
          f"{wall_s / 60:.1f} min in all\n")
    print(f"Bundle: {args.candidate}; p99 target {args.p99_ms:g} ms; grid: max batch {args.batch_sizes} x delay "
          f"{args.delays_ms} ms x instances {args.instances} ({len(grid)} configurations); {args.seconds:g} s of "
          f"Poisson arrivals per rate, from {args.start_rate:g}/s, {args.steps} bisections; {record.tool} over http"
          f"{'; sweep perf_analyzer options: ' + args.pa_args if args.pa_args else ''}\n")
    searched = [p for p in record.points if p.round == 0]
    why = {"late": 0, "p99": 0, "errors": 0}
    for p in record.points:
        if not p.under:
            why["errors" if p.errors else "late" if p.delayed_pct > LATE_PCT else "p99"] += 1
    repeats = len(record.points) - len(searched)
    print(f"**temper capacity** ({capacity_s:.0f} s, {len(searched)} search points + {repeats} repeat points, "
          f"{len({p.choice for p in searched})} of {len(grid)} configurations offered load): chosen "
          f"{chosen.label()}, {record.rate:,.1f} req/s (knees {', '.join(f'{k:,.1f}' for k in record.knees)}; 95% "
          f"interval {record.interval[0]:,.1f}-{record.interval[1]:,.1f}); points over the target by cause: "
          f"{why['p99']} p99, {why['late']} late (>5% sent late), {why['errors']} unanswered\n")
    print(f"**Hand sweep** ({sweep_s:.0f} s, every configuration):\n")
    print("| configuration | knee req/s | p99 ms at the knee | rates tried | first over because | capacity's knee |")
    print("|---|---:|---:|---:|---|---:|")
    for config in grid:
        top, rates = sweep[config]
        at = next((r for r in rates if r.rate == top and r.under), None)
        over = next((r.why(args.p99_ms) for r in rates if not r.under), "-")
        mine = max((p.rate for p in searched if p.under and Config(p.choice.max_batch_size, p.choice.max_delay_ms,
                                                                    p.choice.instances) == config), default=None)
        mark = " **(capacity)**" if config == chosen else ""
        print(f"| {config.label()}{mark}{' (sweep best)' if config == best else ''} | {top:,.1f} | "
              f"{at.p99_ms if at else float('nan'):.2f} | {len(rates)} | {over} | "
              f"{'-' if mine is None else f'{mine:,.1f}'} |")
    print()
    sweep_top = sweep[best][0]
    if best == chosen:
        print(f"**Verdict:** capacity chose the sweep's best configuration ({chosen.label()}): same rate at the target "
              f"by construction; capacity's knee {record.rate:,.1f} req/s vs the sweep's {sweep_top:,.1f} "
              f"({record.rate / sweep_top:.2f}x, measured minutes apart).")
    else:
        c, s = statistics.median(rounds[chosen]), statistics.median(rounds[best])
        ratio = c / s if s else float("nan")
        print(f"**Head to head** ({args.rounds} alternating rounds, the sweep's procedure, fresh servers): capacity's "
              f"{chosen.label()} {', '.join(f'{v:,.1f}' for v in rounds[chosen])} req/s vs the sweep's {best.label()} "
              f"{', '.join(f'{v:,.1f}' for v in rounds[best])} req/s: medians {c:,.1f} / {s:,.1f} = {ratio:.2f}x.\n")
        verdict = "met" if ratio >= 1.0 else "not met"
        print(f"**Verdict:** same or better rate at the target: {verdict} ({ratio:.2f}x of the sweep's best).")
    print("\n" + json.dumps({"capacity": {"chosen": chosen.label(), "rate": record.rate, "knees": record.knees},
                             "sweep": {c.label(): sweep[c][0] for c in grid},
                             "head_to_head": {c.label(): v for c, v in rounds.items()}}))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
