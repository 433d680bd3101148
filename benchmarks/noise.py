"""How stable temper's speed verdicts are on the digits recipe, on an idle machine and under load.

    .venv/bin/python -m benchmarks.noise [--runs N] [--json PATH] [--timeout SECONDS]

A speed gate decides on a confidence interval of the speedup, so noise should make it say
"inconclusive", never turn a pass into a fail from one run to the next. This script checks that on
the shipped recipes/digits-cnn.yaml: it copies the recipe (without its `publish:` section: a benchmark
registers nothing) and the files it uses into a temp folder with a private step cache, builds once
(a warm-up whose verdicts are not counted), then runs `temper run` 2N times, alternating idle runs
with runs that share the cores with two spinning processes, so drift over time hits both sides.

Markdown goes to stdout: per (candidate, speed gate) the pass/fail/inconclusive counts idle and loaded,
the flips (a pass in one run and a fail in another), and what a gate on the point estimate alone
(`measured >= budget`) would have decided from the same runs. temper's output goes to a log per run;
a run that exits non-zero has its log's tail printed to stderr.

Exit status: 0 when the measured runs were made (their failures are reported, not enforced); 2 or 3
when the warm-up `temper run` exited so (bad input, missing environment); 4 when the warm-up wrote no
report.json for any other reason.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from temper.validators import report_model
from temper.validators.report_model import Report

ROOT = Path(__file__).resolve().parent.parent

RECIPES = ROOT / "recipes"
RECIPE_FILES = ("digits-cnn.yaml", "digits_model.py", "digits_data.py", "digits_cnn.pt")
BUSY = 2  # spinning processes during a loaded run
NO_REPORT = 4
IDLE, LOADED = "idle", "loaded"
VERDICTS = ("pass", "fail", "inconclusive")


@dataclass
class Verdict:
    """One speed gate of one candidate in one run, with the measurement it was decided on."""

    candidate: str
    gate: str
    verdict: str
    measured: float | None  # geometric-mean speedup over the rounds
    budget: float | None  # min_speedup
    interval: list[float] | None
    rounds: int | None
    spread_pct: float | None
    load: dict[str, float | None] | None

    @property
    def point(self) -> str | None:
        """What a gate on the point estimate alone would have said (None: nothing measured)."""
        if self.measured is None or self.budget is None:
            return None
        return "pass" if self.measured >= self.budget else "fail"


@dataclass
class Run:
    """One measured `temper run`."""

    index: int
    condition: str  # IDLE or LOADED
    exit_code: int | None  # None: killed at --timeout
    wall_s: float
    selected: str | None = None
    selection_reason: str | None = None
    verdicts: list[Verdict] = field(default_factory=list)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, metavar="N", help="runs idle and runs loaded (default: 5)")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="write every run's raw rows here")
    parser.add_argument("--timeout", type=float, default=600.0, metavar="SECONDS",
                        help="limit for one `temper run` (default: 600)")
    parser.add_argument("--min-speedup", type=float, default=None, metavar="X",
                        help="the speed gates' bar instead of the recipe's 1.2: put it where a candidate really "
                             "is (fp16 is about 1.0x FP32 on a CPU) to see how the gate behaves at its hardest")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error(f"--runs must be at least 1, got {args.runs}")
    if args.timeout <= 0:
        parser.error(f"--timeout must be more than 0 seconds, got {args.timeout}")
    if args.min_speedup is not None and args.min_speedup <= 0:
        parser.error(f"--min-speedup must be more than 0, got {args.min_speedup}")
    temper = Path(sys.executable).parent / "temper"
    if not temper.is_file():
        print(f"error: no `temper` beside {sys.executable}; run `make run` or `pip install -e .` first",
              file=sys.stderr)
        return 3
    signal.signal(signal.SIGTERM, _terminate)  # so `finally` kills the busy processes

    started = datetime.datetime.now()
    with tempfile.TemporaryDirectory(prefix="temper-noise-") as tmp:
        work = Path(tmp)
        recipe = _stage(work, args.min_speedup)
        print("warm-up: building every model into the private cache (verdicts not counted)",
              file=sys.stderr, flush=True)
        code, wall, warm = _temper_run(temper, recipe, work / "warm-up", args.timeout, busy=0)
        if warm is None:
            how = "timed out" if code is None else f"exited {code}"
            print(f"error: the warm-up temper run {how} without a report.json", file=sys.stderr)
            return code if code in (2, 3) else NO_REPORT
        print(f"warm-up: exit {code}, {wall:.0f} s", file=sys.stderr, flush=True)
        runs = []
        for index in range(2 * args.runs):
            condition = LOADED if index % 2 else IDLE
            code, wall, report = _temper_run(temper, recipe, work / f"run-{index + 1}", args.timeout,
                                             busy=BUSY if condition == LOADED else 0)
            run = _record(index + 1, condition, code, wall, report)
            runs.append(run)
            print(f"run {run.index}/{2 * args.runs} ({condition}): exit {_exit(code)}, {wall:.0f} s, "
                  f"selected {run.selected or 'no report'}", file=sys.stderr, flush=True)

    print(_markdown(warm, runs, started))
    if args.json is not None:
        args.json.write_text(json.dumps({
            "recipe": "recipes/digits-cnn.yaml", "date": started.isoformat(timespec="seconds"),
            "host": warm.host.model_dump(),
            "speed_policy": warm.speed_policy.model_dump() if warm.speed_policy else None, "busy_processes": BUSY,
            "runs": [asdict(run) for run in runs]}, indent=1) + "\n")
    return 0


def _terminate(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def _stage(work: Path, min_speedup: float | None) -> Path:
    """Copy the recipe and its files into `work`, without `publish:` (a benchmark registers nothing)."""
    for name in RECIPE_FILES:
        shutil.copy2(RECIPES / name, work / name)
    recipe = work / RECIPE_FILES[0]
    data = yaml.safe_load(recipe.read_text())
    data.pop("publish", None)
    if min_speedup is not None:
        data["validate"]["throughput"]["min_speedup"] = min_speedup
    recipe.write_text(yaml.safe_dump(data, sort_keys=False))
    return recipe


def _temper_run(temper: Path, recipe: Path, output: Path, timeout: float,
                busy: int) -> tuple[int | None, float, Report | None]:
    """One `temper run` with `busy` spinning processes sharing the cores for its whole length.

    Returns the exit code (None: killed at the timeout), wall seconds and the report (None: none written)."""
    log = output.with_suffix(".log")
    hogs: list[subprocess.Popen[bytes]] = []
    code: int | None = None
    try:
        for _ in range(busy):
            hogs.append(subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL))
        began = time.monotonic()  # after the busy processes start: they are not temper's time
        # cwd is the temp folder: anything temper writes by default (an MLflow store) lands there.
        with log.open("w") as out:
            code = subprocess.run([str(temper), "run", str(recipe), "--output", str(output),
                                   "--cache-dir", str(recipe.parent / "cache")], cwd=recipe.parent,
                                  stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                  timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        print(f"error: temper run killed after {timeout:g} s", file=sys.stderr)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    wall = time.monotonic() - began
    if code != 0:
        tail = log.read_text(errors="replace").splitlines()[-20:]
        print(f"--- last lines of {output.name}'s output (exit {_exit(code)}):", *tail, sep="\n", file=sys.stderr)
    report = output / "report.json"
    return code, wall, report_model.load(report) if code is not None and report.is_file() else None


def _exit(code: int | None) -> str:
    return "timeout" if code is None else str(code)


def _record(index: int, condition: str, code: int | None, wall: float, report: Report | None) -> Run:
    """The run's speed-gate verdicts, each with the throughput entry it was decided on."""
    run = Run(index, condition, code, round(wall, 2))
    if report is None:
        return run
    run.selected, run.selection_reason = report.selected, report.selection_reason
    for name, candidate in report.candidates.items():
        entries = {f"throughput.{m.provider}.b{m.batch_size}": m for m in candidate.throughput}
        for gate in candidate.gates:
            if not gate.name.startswith("throughput."):
                continue
            entry = entries.get(gate.name)
            run.verdicts.append(Verdict(name, gate.name, gate.verdict, gate.measured, gate.budget,
                                        None if gate.interval is None else list(gate.interval),
                                        entry.rounds if entry else None, entry.spread_pct if entry else None,
                                        entry.load.model_dump() if entry and entry.load else None))
    return run


def _markdown(warm: Report, runs: list[Run], started: datetime.datetime) -> str:
    host = warm.host.summary()
    policy = warm.speed_policy
    per_side = len(runs) // 2
    sizes = ", ".join(map(str, policy.gated_batch_sizes if policy else []))
    lines = ["### Speed-verdict noise: recipes/digits-cnn.yaml", "",
             f"**Machine:** {host}; {started:%Y-%m-%d %H:%M}", "",
             f"{per_side} idle and {per_side} loaded runs ({BUSY} spinning processes sharing the cores), "
             f"alternated, after one warm-up build. Speed gates: speedup >= {policy and policy.min_speedup} at batch "
             f"{sizes}, {policy.confidence if policy else 0:.0%} interval, at most {policy and policy.max_duration_s} "
             f"s per batch size, inconclusive counted as a {policy and policy.inconclusive}.", ""]

    pairs: dict[tuple[str, str], list[tuple[str, Verdict]]] = {}
    for run in runs:
        for v in run.verdicts:
            pairs.setdefault((v.candidate, v.gate), []).append((run.condition, v))
    head = ["candidate", "gate"] + [f"{side} {verdict}" for side in (IDLE, LOADED) for verdict in VERDICTS]
    head += ["speedup idle", "speedup loaded", "rounds", "point pass/fail", "flip", "point flip"]
    rows, flips, point_flips = [], [], []
    for (candidate, gate), seen in pairs.items():
        counts = {side: Counter(v.verdict for s, v in seen if s == side) for side in (IDLE, LOADED)}
        points = Counter(v.point for _, v in seen if v.point is not None)
        flip = _flipped(v.verdict for _, v in seen)
        point_flip = _flipped(v.point for _, v in seen)
        if flip:
            flips.append(f"{candidate} {gate}")
        if point_flip:
            point_flips.append(f"{candidate} {gate}")
        rows.append([candidate, gate] + [str(counts[side][verdict]) for side in (IDLE, LOADED) for verdict in VERDICTS]
                    + [_span((v.measured for s, v in seen if s == side), "{:.2f}x") for side in (IDLE, LOADED)]
                    + [_span((v.rounds for _, v in seen), "{}"), f"{points['pass']}/{points['fail']}",
                       "**yes**" if flip else "no", "**yes**" if point_flip else "no"])
    lines += [_table(head, rows, left=2), ""]

    failed = [f"#{r.index} ({r.condition}): {_exit(r.exit_code)}"
              for r in runs if r.exit_code != 0]
    inconclusive = Counter(r.condition for r in runs for v in r.verdicts if v.verdict == "inconclusive")
    walls = {side: statistics.median(r.wall_s for r in runs if r.condition == side) for side in (IDLE, LOADED)}
    selected = {side: Counter(r.selected or "no report" for r in runs if r.condition == side)
                for side in (IDLE, LOADED)}
    met = not failed and not flips
    lines += [
        f"- **Flips** (pass in one run, fail in another; inconclusive counts as neither): {len(flips)}"
        + (f" ({', '.join(flips)})" if flips else ""),
        f"- **Inconclusive verdicts:** {sum(inconclusive.values())} "
        f"({inconclusive[IDLE]} idle, {inconclusive[LOADED]} loaded)",
        f"- **Point-estimate gate** (`measured >= budget`, same runs), flips: {len(point_flips)}"
        + (f" ({', '.join(point_flips)})" if point_flips else ""),
        f"- **Runs that exited non-zero:** {len(failed)} of {len(runs)}"
        + (f" ({'; '.join(failed)})" if failed else ""),
        f"- **Median wall time:** idle {walls[IDLE]:.1f} s, loaded {walls[LOADED]:.1f} s",
        "- **Selected:** " + "; ".join(f"{side}: " + ", ".join(f"{name} in {n} of {per_side}"
                                                               for name, n in selected[side].items())
                                       for side in (IDLE, LOADED)),
        f"- **Target** (every run exits 0, zero flips): {'met' if met else '**missed**'}",
        "", _runs_table(runs)]
    return "\n".join(lines)


def _flipped(verdicts: Iterable[str | None]) -> bool:
    """Pass somewhere and fail elsewhere: the gate's answer depended on the run, not the model."""
    seen = set(verdicts)
    return "pass" in seen and "fail" in seen


def _span(values: Iterable[float | None], shown: str) -> str:
    """min–max of the known values, each formatted with `shown`; one value when they agree."""
    known = [v for v in values if v is not None]
    if not known:
        return "—"
    low, high = shown.format(min(known)), shown.format(max(known))
    return low if low == high else f"{low}–{high}"


def _runs_table(runs: list[Run]) -> str:
    """Per run: the load its timing windows saw (medians over its speed gates), to tell loaded runs really were."""
    head = ["run", "condition", "selected", "exit", "wall s", "load 1m", "busy %", "steal %"]
    rows = []
    for run in runs:
        loads = [v.load for v in run.verdicts if v.load]
        figures = [_median([load[key] for load in loads]) for key in ("load_1m", "busy_pct", "steal_pct")]
        rows.append([str(run.index), run.condition, run.selected or "no report",
                     _exit(run.exit_code), f"{run.wall_s:.1f}", *figures])
    return _table(head, rows, left=3) + "\n\nload 1m, busy %, steal %: medians over the run's gated timing windows."


def _median(values: list[float | None]) -> str:
    known = [v for v in values if v is not None]
    return f"{statistics.median(known):.1f}" if known else "—"


def _table(head: list[str], rows: list[list[str]], left: int) -> str:
    """A padded Markdown table; columns from `left` on are right-aligned (numbers)."""
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) if i < left else c.rjust(w)
                                 for i, (c, w) in enumerate(zip(cells, widths))) + " |"

    rule = "|" + "|".join("-" * (w + 2) if i < left else "-" * (w + 1) + ":" for i, w in enumerate(widths)) + "|"
    return "\n".join([line(head), rule, *(line(r) for r in rows)])


if __name__ == "__main__":
    sys.exit(main())
