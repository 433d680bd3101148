"""temper's chosen INT8 configuration vs ONNX Runtime's defaults, side by side.

    .venv/bin/python -m benchmarks.tuning [--duration SECONDS] [--cache-dir DIR] [RECIPE ...]

For each recipe (default: recipes/digits-search.yaml and recipes/minilm-static.yaml) temper builds
and validates its candidates (configuration search, presets, accuracy fallback) and selects one.
From the same baseline and calibration batches the script then builds what a user gets from ONNX
Runtime with no options: `quantize_static(model, out, reader)` and `quantize_dynamic(model, out)`.
All three are validated together against the recipe's gates (accuracy drop on the evaluation set,
throughput at batch 1, 8 and 32 measured in interleaved slices) and printed as Markdown: the drop,
samples/s, and temper's choice as a ratio of each default in the same run.

Exit status: 0 when every recipe produced a comparison; 2/3 for bad input or a missing environment.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import os
import platform
import sys
import tempfile
from pathlib import Path
from typing import Any

from onnxruntime.quantization import CalibrationDataReader, quantize_dynamic, quantize_static

from temper.artifacts.core import onnx_io
from temper.artifacts.core.errors import TemperError
from temper.pipeline import gating
from temper.pipeline.cache import StepCache, default_root
from temper.pipeline.loading import load_recipe
from temper.pipeline.runner import Runner
from temper.pipeline.steps.quantize import calibration_feeds
from temper.validators.report_model import Report
from temper.validators.validation import build_report, validate

ROOT = Path(__file__).resolve().parent.parent

DEFAULT = [ROOT / "recipes" / "digits-search.yaml", ROOT / "recipes" / "minilm-static.yaml"]
SIZES = [1, 8, 32]
DEFAULTS = {"ort-static-default": "quantize_static() defaults: QDQ, per-tensor, MinMax, S8S8, no pre-processing",
            "ort-dynamic-default": "quantize_dynamic() defaults: per-tensor S8 weights"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recipes", nargs="*", type=Path, default=DEFAULT)
    parser.add_argument("--duration", type=float, default=3.0, help="timed seconds per model and batch size")
    parser.add_argument("--cache-dir", type=Path, default=None, help="step cache (default: temper's)")
    args = parser.parse_args(argv)
    print(f"machine: {platform.machine()}, {platform.processor() or 'cpu'}, {_cores()} cores; "
          f"throughput {args.duration:g} s per model and batch size, interleaved\n")
    for recipe in args.recipes:
        try:
            print(compare(recipe, args.duration, args.cache_dir or default_root()))
        except TemperError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return exc.exit_code
    return 0


def compare(recipe: Path, duration: float, cache: Path) -> str:
    loaded = load_recipe(recipe)
    runner = Runner(loaded, StepCache(cache))
    try:
        print(f"{recipe.name}: temper run (build, tune, validate) ...", file=sys.stderr, flush=True)
        result = runner.run()
        verdict = build_report(validate(gating.from_run(runner, result)))
        chosen = verdict.selected
        if not verdict.passed:  # the baseline is selected: there is no candidate of temper's to compare
            return f"## {loaded.recipe.name}\n\nno candidate passed every gate; nothing to compare\n"
        models: dict[str, Path | str] = {f"temper: {chosen}": next(c.model.path for c in result.candidates
                                                                   if c.name == chosen and c.model)}
        models |= _ort_defaults(runner, result.baseline[-1].path)
        subject = gating.subject(runner, result.baseline[-1].path, models)
        spec = subject.spec
        assert spec.throughput is not None
        timing = spec.throughput.model_copy(update={"batch_sizes": SIZES, "duration_s": duration,
                                                    "min_speedup": None, "speedup_at": None})
        print(f"{recipe.name}: measuring {', '.join(models)} side by side ...", file=sys.stderr, flush=True)
        side = build_report(validate(dataclasses.replace(subject, spec=spec.model_copy(update={"throughput": timing}))))
        return _table(loaded.recipe.name, chosen, _options(loaded.recipe.candidates[chosen]), side)
    finally:
        runner.close()


def _ort_defaults(runner: Runner, baseline: Path) -> dict[str, Path | str]:
    folder = Path(tempfile.mkdtemp(prefix="ort-defaults-", dir=runner.scratch))
    feeds = calibration_feeds(onnx_io.load_structure(baseline), runner.calibration_batches)
    built: dict[str, Path | str] = {}
    for name, build in (("ort-static-default", lambda dst: quantize_static(str(baseline), str(dst), _Reader(feeds))),
                        ("ort-dynamic-default", lambda dst: quantize_dynamic(str(baseline), str(dst)))):
        (folder / name).mkdir()
        dst = folder / name / "model.onnx"
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                build(dst)
            built[name] = dst
        except Exception as exc:  # a default that cannot build is a result too
            built[name] = f"ONNX Runtime failed: {str(exc).splitlines()[0]}"
    return built


class _Reader(CalibrationDataReader):
    def __init__(self, feeds: list[dict[str, Any]]) -> None:
        self._feeds = iter(feeds)

    def get_next(self) -> dict[str, Any] | None:
        return next(self._feeds, None)


def _options(candidate: Any) -> str:
    return "; ".join(f"{s.name}: " + ", ".join(f"{k}={v}"
                                               for k, v in s.options.model_dump(exclude_defaults=True).items())
                     for s in candidate.steps)


def _table(recipe: str, chosen: str, options: str, report: Report) -> str:
    metric = report.metric
    lines = [f"## {recipe}", "", f"temper selected `{chosen}` ({options}).", "",
             f"| model | {metric} drop | " + " | ".join(f"samples/s b{b}" for b in SIZES) + " | configuration |",
             "|---|---|" + "---|" * len(SIZES) + "---|"]
    speeds: dict[str, dict[int, float]] = {}
    for name, c in report.candidates.items():
        speeds[name] = {m.batch_size: m.samples_per_s for m in c.throughput}
        drop = "build failed" if c.drop is None else f"{c.drop:+.4f}"
        config = DEFAULTS.get(name, options)
        if c.drop is None:
            config = next(g.detail for g in c.gates if g.name == "build")
        lines.append(f"| {name} | {drop} | " + " | ".join(f"{speeds[name].get(b, 0):,.0f}" for b in SIZES)
                     + f" | {config} |")
    base = {m.batch_size: m.samples_per_s for m in report.baseline.throughput}
    lines.append("| FP32 baseline | — | " + " | ".join(f"{base[b]:,.0f}" for b in SIZES) + " | |")
    ours = speeds[f"temper: {chosen}"]
    lines.append("")
    for name in DEFAULTS:
        if speeds.get(name):
            ratios = ", ".join(f"{ours[b] / speeds[name][b]:.2f}x" for b in SIZES)
            lines.append(f"- temper's choice vs {name}: {ratios} the speed at batch {'/'.join(map(str, SIZES))}; "
                         f"drop {report.candidates[f'temper: {chosen}'].drop:+.4f} vs "
                         f"{report.candidates[name].drop:+.4f}")
    return "\n".join(lines) + "\n"


def _cores() -> int:
    return len(os.sched_getaffinity(0))


if __name__ == "__main__":
    sys.exit(main())
