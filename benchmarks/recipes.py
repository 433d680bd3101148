"""Benchmark the shipped recipes: run `temper run` on each and print its report.json as Markdown tables.

    .venv/bin/python -m benchmarks.recipes [--out-base DIR] [--duration SECONDS] [RECIPE ...]

Each recipe runs as a subprocess (`temper run RECIPE --output OUT_BASE/<name>`) with
TEMPER_CACHE_DIR=OUT_BASE/cache, so a rerun with the same --out-base reuses every built model
and only measures again. temper's own progress goes to stderr; stdout is only Markdown. A recipe's
`publish:` section is left out (a benchmark registers nothing), by running a copy of it.

Speedups are the ratios report.json already holds: each candidate against the FP32 baseline
measured side by side in the same run (see benchmarks/README.md).

Exit status: 0 when every run produced a report (gates that fail are reported, not enforced);
2 or 3 when a `temper run` exited with that code (bad input, missing environment); 4 when a run
ended without a report.json for any other reason (crash, interrupt).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from temper.validators import report_model
from temper.validators.report import speedup_text
from temper.validators.report_model import Measurement, Report

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = [ROOT / "recipes" / "digits-cnn.yaml", ROOT / "recipes" / "minilm.yaml"]
NO_REPORT = 4


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recipes", nargs="*", type=Path, default=SHIPPED,
                        help="recipe files (default: the shipped digits-cnn and minilm recipes)")
    parser.add_argument("--out-base", type=Path, default=None,
                        help="folder for the outputs and the step cache (default: a new temp dir, kept)")
    parser.add_argument("--duration", type=float, default=None, metavar="SECONDS",
                        help="override validate.throughput.duration_s (timed seconds per model and batch size)")
    args = parser.parse_args(argv)
    if args.duration is not None and args.duration <= 0:
        parser.error(f"--duration must be more than 0 seconds, got {args.duration}")
    temper = _temper()
    if temper is None:
        print("error: no `temper` command next to this Python or on PATH; run `make run` or "
              "`pip install -e .` first", file=sys.stderr)
        return 3

    base = (args.out_base or Path(tempfile.mkdtemp(prefix="temper-bench-"))).resolve()
    base.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "TEMPER_CACHE_DIR": str(base / "cache"),
           "MLFLOW_TRACKING_URI": f"sqlite:///{base / 'mlflow.db'}"}  # never the caller's registry
    signal.signal(signal.SIGTERM, _terminate)  # so `finally` removes the recipe copies
    print(f"outputs and cache: {base}", file=sys.stderr)

    sections, reports, code = [], [], 0
    for recipe in args.recipes:
        name = _recipe_name(recipe)
        output = base / name
        print(f"\n=== temper run {recipe} --output {output}", file=sys.stderr, flush=True)
        rc, duration = _run(temper, recipe, output, args.duration, env)
        report_file = output / "report.json"
        if rc in (2, 3):
            print(f"error: temper run {recipe} exited {rc} ({'bad input' if rc == 2 else 'environment'})",
                  file=sys.stderr)
            code = code or rc
            continue
        if rc not in (0, 1) or not report_file.is_file():
            why = "no validate section?" if rc in (0, 1) else "interrupted or crashed"
            print(f"error: temper run {recipe} exited {rc} without {report_file} ({why})", file=sys.stderr)
            code = code or NO_REPORT
            continue
        report = report_model.load(report_file)
        reports.append(report)
        sections.append(_section(report, recipe, duration, rc))

    print(_machine(reports))
    for section in sections:
        print()
        print(section)
    return code


def _temper() -> str | None:
    beside = Path(sys.executable).parent / "temper"
    return str(beside) if beside.is_file() else shutil.which("temper")


def private_base(out_base: Path | None, prefix: str) -> tuple[Path, dict[str, str]]:
    """The benchmark's output folder (a new temporary one by default) and the environment its `temper run`s
    get: their own step cache and MLflow store in it, offline model hubs; SIGTERM stops the child run too."""
    base = (out_base or Path(tempfile.mkdtemp(prefix=prefix))).resolve()
    base.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "TEMPER_CACHE_DIR": str(base / "cache"), "HF_HUB_OFFLINE": "1",
           "MLFLOW_TRACKING_URI": f"sqlite:///{base / 'mlflow.db'}"}
    signal.signal(signal.SIGTERM, _terminate)
    return base, env


def _terminate(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def _recipe_name(recipe: Path) -> str:
    try:
        name = yaml.safe_load(recipe.read_text()).get("name")
    except Exception:  # temper run reports the real problem (exit 2)
        name = None
    return name if isinstance(name, str) and name else recipe.stem


def _run(temper: str, recipe: Path, output: Path, duration: float | None,
         env: dict[str, str]) -> tuple[int, float | None]:
    """Run temper on the recipe, or on a copy beside it (another throughput duration, no publish).

    Returns temper's exit code and the duration_s the run used (None: the recipe measures none)."""
    recipe = recipe.resolve()
    data = _load(recipe)
    throughput = ((data or {}).get("validate") or {}).get("throughput")
    used = throughput.get("duration_s", 3.0) if isinstance(throughput, dict) else None
    changed = False
    if duration is not None and isinstance(throughput, dict):
        throughput["duration_s"] = used = duration
        changed = True
    elif duration is not None:
        print(f"note: {recipe} has no validate.throughput section; --duration ignored", file=sys.stderr)
    if data is not None and data.pop("publish", None) is not None:
        # A benchmark measures; it must never register versions in anyone's MLflow registry.
        print(f"note: {recipe.name}: publish section left out of the benchmark run", file=sys.stderr)
        changed = True
    copy = None
    if changed:
        # Paths in a recipe are relative to its folder: the copy must live there too.
        copy = recipe.parent / f".bench-{recipe.stem}.yaml"
        copy.write_text(f"# temporary copy of {recipe.name} written by benchmarks/recipes.py; safe to delete\n"
                        + yaml.safe_dump(data, sort_keys=False))
    try:
        # temper's stdout (summary tables) joins its progress on our stderr: stdout stays Markdown.
        # cwd is the output base, so nothing temper writes by default lands in the caller's folder.
        rc = subprocess.run([temper, "run", str(copy or recipe), "--output", str(output)], cwd=output.parent,
                            env=env, stdout=sys.stderr, stderr=sys.stderr).returncode
    finally:
        if copy is not None:
            copy.unlink(missing_ok=True)
    return rc, used


def _load(recipe: Path) -> dict | None:
    try:
        data = yaml.safe_load(recipe.read_text())
    except Exception:
        return None
    return data if isinstance(data, dict) else None


def _machine(reports: list[Report]) -> str:
    """The host profile temper recorded in the reports (the same code that measured), and when."""
    today = datetime.date.today().isoformat()
    if not reports:
        return f"**Machine:** no report, {today}"
    host = reports[0].host.summary()
    loads = [m.load.load_1m for r in reports for m in r.baseline.throughput if m.load]
    load = f"; load average during the runs {min(loads):.2f}-{max(loads):.2f}" if loads else ""
    return f"**Machine:** {host}; Python {platform.python_version()}, {today}{load}"


def _section(report: Report, recipe: Path, duration: float | None, rc: int) -> str:
    metric = report.metric
    candidates = report.candidates
    measured = report.baseline.throughput
    keys = sorted({(m.provider, m.batch_size) for m in measured}
                  | {(m.provider, m.batch_size) for c in candidates.values() for m in c.throughput})
    several = len({p for p, _ in keys}) > 1

    def label(provider: str, batch: int) -> str:
        return f"{provider} b{batch}" if several else f"b{batch}"

    head = ["model", metric or "metric", "drop", "verdict"]
    for key in keys:
        head += [f"{label(*key)} samples/s", f"{label(*key)} x"]
    rows = [_row("baseline", report.baseline.metric, None, "baseline", measured, keys, baseline=True)]
    for name, c in candidates.items():
        failed = [g.name for g in c.gates if not g.passed]
        verdict = "pass" if c.passed else f"FAIL ({', '.join(failed)})" if failed else "FAIL"
        shown = f"**{name}**" if name == report.selected else name
        rows.append(_row(shown, c.metric, c.drop, verdict, c.throughput, keys))

    lines = [f"### {report.recipe}", ""]
    notes = [f"recipe `{_shown(recipe)}`"]
    if report.allowed_drop is not None:
        notes.append(f"allowed drop {report.allowed_drop:.4f}")
    if duration is not None:
        notes.append(f"{duration:g} s timed per model and batch size")
    if rc == 1:
        notes.append("temper exited 1 (a step failed)")
    lines += ["; ".join(notes) + "; speedups with their 95% confidence interval", "", _table(head, rows), ""]
    lines.append(f"Selected: `{report.selected}` ({report.select})"
                 + (f": {report.selection_reason}" if report.selection_reason else ""))
    return "\n".join(lines)


def _row(name: str, metric: float | None, drop: float | None, verdict: str, throughput: Sequence[Measurement],
         keys: list[tuple[str, int]], baseline: bool = False) -> list[str]:
    by_key = {(m.provider, m.batch_size): m for m in throughput}
    row = [name, "—" if metric is None else f"{metric:.4f}", "—" if drop is None else f"{drop:+.4f}", verdict]
    for key in keys:
        m = by_key.get(key)
        if m is None:
            row += ["—", "—"]
            continue
        rate = m.samples_per_s
        row += [f"{rate:,.0f}" if rate >= 100 else f"{rate:.1f}", "1.00x" if baseline else speedup_text(m)]
    return row


def _table(head: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    right = [False] * 4 + [True] * (len(head) - 4)  # numbers right-aligned from the throughput columns on
    right[1] = right[2] = True

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right)) + " |"

    rule = "|" + "|".join(("-" * (w + 1) + ":") if r else ("-" * (w + 2)) for w, r in zip(widths, right)) + "|"
    return "\n".join([line(head), rule, *(line(r) for r in rows)])


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


if __name__ == "__main__":
    sys.exit(main())
