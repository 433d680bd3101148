"""temper's accuracy fallback against NNCF's accuracy control: MiniLM static INT8 held to one budget.

    .venv/bin/python -m benchmarks.fallback_vs_nncf [--out-base DIR] [--max-iterations N]
                                                    [--timeout SECONDS] [--duration SECONDS] [--rounds N]

Both start from the same all-MiniLM-L6-v2 FP32 export, the same 500 calibration texts and the same
500 held-out texts, and aim at the same budget: recipes/minilm-static.yaml's `probe` accuracy drop of at
most 0.02 (a logistic regression trained on the FP32 embeddings of the calibration texts, scored on the
held-out ones).

- temper: the recipe's `int8-static-fallback` candidate (`quantize: {mode: static, fallback:
  {max_trials: 12}}`), run by `temper run` on a generated recipe (OUT_BASE/fallback.yaml; the shipped
  recipe's model, data, shared `simplify` and gates, that one candidate). Its time is the step's own
  build time from manifest.json (calibration, trials and the SQNR ranking; a cached step keeps its first
  build's time).
- NNCF: `nncf.quantize_with_accuracy_control` (NNCF's ONNX backend) in a child process, on the export
  itself (as temper's `backend: nncf`), with the options temper's NNCF candidate uses for a transformer
  (`model_type: transformer`, SmoothQuant off, every calibration batch), `max_drop` = the recipe's allowed
  drop, and a validation function computing the recipe's metric with temper's own scorer code on the
  held-out texts, one data item per text (so NNCF can rank on per-item outputs). Its bounds: at most
  --max-iterations reverted groups (default 12, the fallback's max_trials), ranking on 64 texts (the
  fallback's SQNR ranking samples), and --timeout seconds of wall time (the child is killed past it).
  Its time is the call's own. NNCF's fully quantized start (its `intermediate_model_dir`) is kept too.

Every resulting model is then scored with temper's gate scorer (the recipe's metric, drop and lowest
cosine on the held-out set) and timed on ONNX Runtime's CPU provider against the FP32 baseline, in one
process, in interleaved rounds (validators/rounds.py, the speed gates' loop; sessions as the gates build
them): the speedup is the geometric mean of the paired per-round ratios with a 95% Student-t interval on
their logarithms (validators/speedup.py). stdout is Markdown.

Exit status: 0 when both sides produced a model; 2/3 when `temper run` exited so; 4 when either side ended
without a model (temper without report.json, NNCF crashed or timed out: the table says which).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from benchmarks.engines import _from_shipped, host_line
from benchmarks.recipes import NO_REPORT, _temper, private_base

ROOT = Path(__file__).resolve().parent.parent

SHIPPED = ROOT / "recipes" / "minilm-static.yaml"
CANDIDATE = "int8-static-fallback"
RANKING_ROWS = 64  # FallbackOptions.samples' default: the rows the fallback ranks nodes on
BATCH_SIZES = [1, 8, 32]


def recipe() -> dict[str, Any]:
    """minilm-static.yaml's model, data, shared steps and gates, with only its fallback candidate."""
    shipped = yaml.safe_load(SHIPPED.read_text())
    generated = _from_shipped("fallback", SHIPPED)
    generated |= {"name": "fallback-vs-nncf", "steps": shipped["steps"],
                  "candidates": {CANDIDATE: shipped["candidates"][CANDIDATE]}}
    return generated


def _runner(recipe_file: Path, cache: Path) -> Any:
    from temper.pipeline.cache import StepCache
    from temper.pipeline.loading import load_recipe
    from temper.pipeline.runner import Runner

    return Runner(load_recipe(recipe_file), StepCache(cache))


def qwac_child(recipe_file: Path, cache: Path, out: Path, iterations: int) -> int:
    """Run NNCF's accuracy control on the recipe's export (from the step cache `temper run` filled) and
    write out/qwac.onnx, out/intermediate_model.onnx and out/qwac.json."""
    import onnx

    from temper.artifacts.core import onnx_io
    from temper.pipeline.quantize_backends import nncf as quantize_nncf
    from temper.pipeline.quantize_backends import quantize_options
    from temper.pipeline.steps.quantize.quantize import calibration_feeds
    from temper.validators import metrics
    from temper.validators.evaluate import predict

    nncf = quantize_nncf.require()  # imported with its telemetry off, as temper's NNCF step does
    from nncf.quantization.advanced_parameters import AdvancedAccuracyRestorerParameters

    with _runner(recipe_file, cache) as runner:
        export = runner.source().path
        baseline = runner.baseline()[-1].path
        layout = runner.layout(baseline)
        scorer = runner.scorer  # the gate's reference: FP32 embeddings, the probe trained on them
        model = onnx.load(str(export))
        feeds = calibration_feeds(model, runner.calibration_batches, layout)
        evaluation = runner.evaluation_set
        batch_size = runner.recipe.data.evaluation.batch_size
    ref = scorer.reference
    labels = np.asarray(ref.labels)
    features = evaluation.features
    items = [(i, {k: v[i:i + 1] for k, v in layout.feed(features).items()}) for i in range(len(evaluation))]
    calls: list[dict[str, Any]] = []
    scratch = Path(tempfile.mkdtemp(prefix="qwac-", dir=out))

    def validate(candidate: onnx.ModelProto, data: Any) -> tuple[float, list[list[np.ndarray]]]:
        """The recipe's metric on the items given (the whole held-out set, or NNCF's one-item probe),
        with temper's own prediction and metric code; the per-item embeddings for NNCF's ranking."""
        began = time.perf_counter()
        index = [i for i, _ in data]
        path = scratch / "candidate.onnx"
        onnx_io.save(candidate, path)
        rows = {k: v[index] for k, v in features.items()}
        emb = predict(path, rows, batch_size, layout)[ref.output]
        train_out, train_labels = ref.train or (None, None)
        value = ref.metric.score(metrics.MetricData(emb, labels[index], ref.baseline_outputs[index],
                                                    train_out, train_labels))
        calls.append({"items": len(index), "metric": value, "seconds": round(time.perf_counter() - began, 2)})
        print(f"qwac validation: {len(index)} items, {ref.metric.name} {value:.4f}", file=sys.stderr, flush=True)
        return value, [[emb[j:j + 1]] for j in range(len(index))]

    options = quantize_options({"mode": "static", "backend": "nncf", "model_type": "transformer",
                                              "smooth_quant_alpha": False})
    restorer = AdvancedAccuracyRestorerParameters(max_num_iterations=iterations, ranking_subset_size=RANKING_ROWS,
                                                  intermediate_model_dir=str(out))
    began = time.perf_counter()
    quantized = nncf.quantize_with_accuracy_control(
        model, nncf.Dataset(feeds), nncf.Dataset(items, lambda item: item[1]), validate,
        max_drop=scorer.allowed_drop, drop_type=nncf.DropType.ABSOLUTE, subset_size=len(feeds),
        model_type=nncf.ModelType.TRANSFORMER, fast_bias_correction=True,
        advanced_quantization_parameters=quantize_nncf._advanced(options, None),  # temper's NNCF settings
        advanced_accuracy_restorer_parameters=restorer)
    seconds = time.perf_counter() - began
    onnx_io.save(quantized, out / "qwac.onnx")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux: KiB
    record = {"seconds": round(seconds, 1), "peak_gib": round(peak, 2), "max_num_iterations": iterations,
              "ranking_subset_size": RANKING_ROWS, "max_drop": scorer.allowed_drop,
              "calibration_batches": len(feeds), "validations": calls}
    (out / "qwac.json").write_text(json.dumps(record, indent=2) + "\n")
    return 0


def run_qwac(recipe_file: Path, cache: Path, out: Path, iterations: int, timeout: float,
             env: dict[str, str]) -> dict[str, Any]:
    """The child's record, its wall time and peak RSS; {"error": ...} when it crashed or ran past `timeout`."""
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("qwac.onnx", "qwac.json", "intermediate_model.onnx"):
        (out / stale).unlink(missing_ok=True)
    command = [sys.executable, __file__, "--qwac-child", str(recipe_file), "--cache", str(cache),
               "--qwac-out", str(out), "--max-iterations", str(iterations)]
    print(f"\n=== NNCF accuracy control (at most {timeout:g} s): {' '.join(command)}", file=sys.stderr, flush=True)
    began = time.monotonic()
    child = subprocess.Popen(command, env=env, stdout=sys.stderr, stderr=sys.stderr)
    try:
        rc: int | None = child.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
        rc = None
    wall = time.monotonic() - began
    if rc is None:
        return {"error": f"killed after {timeout:g} s (--timeout)", "wall": wall}
    if rc != 0 or not (out / "qwac.json").is_file():
        return {"error": f"exited {rc} (see stderr)", "wall": wall}
    return {**json.loads((out / "qwac.json").read_text()), "wall": wall}


def bench(models: dict[str, Path], sample: dict[str, np.ndarray], layout: Any, duration: float,
          rounds: int) -> dict[str, dict[int, str]]:
    """Each model's speedup over the first (the FP32 baseline) per batch size, interleaved in this process."""
    from temper.validators.rounds import Bench, Timing, interleave
    from temper.validators.speedup import estimate
    from temper.validators.throughput import tuned_session

    sessions = {name: tuned_session(path, "cpu", sample, layout) for name, path in models.items()}
    paths = {name: (path, "cpu") for name, path in models.items()}
    reference = next(iter(models))
    shown: dict[str, dict[int, str]] = {name: {} for name in models}
    for size in BATCH_SIZES:
        print(f"timing batch {size}: {', '.join(models)}", file=sys.stderr, flush=True)
        timing = Timing(duration / rounds, 0.5, rounds)
        done = interleave(Bench(size, reference, {name: {} for name in models}), sessions, paths, sample, layout,
                          timing, lambda bench, name: True)
        for name in models:
            shown[name][size] = ("1.00x" if name == reference
                                 else estimate(done.ratios(name), 0.95).shown())
    return shown


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-base", type=Path, default=None, help="outputs and the step cache (default: a temp dir)")
    parser.add_argument("--max-iterations", type=int, default=12,
                        help="NNCF's max_num_iterations: groups reverted to float at most (default 12)")
    parser.add_argument("--timeout", type=float, default=900.0, help="NNCF's wall-time bound in seconds (default 900)")
    parser.add_argument("--duration", type=float, default=4.0,
                        help="timed seconds per model and batch size in the speed comparison (default 4)")
    parser.add_argument("--rounds", type=int, default=8, help="interleaved rounds per batch size (default 8)")
    parser.add_argument("--qwac-child", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--cache", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--qwac-out", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for flag, value, low in (("--max-iterations", args.max_iterations, 1), ("--timeout", args.timeout, 1),
                             ("--duration", args.duration, 0.1), ("--rounds", args.rounds, 2)):
        if value < low:
            parser.error(f"{flag} must be at least {low:g}, got {value:g}")
    if args.qwac_child is not None:
        return qwac_child(args.qwac_child, args.cache, args.qwac_out, args.max_iterations)
    temper = _temper()
    if temper is None:
        print("error: no `temper` command next to this Python or on PATH", file=sys.stderr)
        return 3

    base, env = private_base(args.out_base, "temper-fallback-nncf-")
    cache = base / "cache"
    recipe_file = base / "fallback.yaml"
    text = yaml.safe_dump(recipe(), sort_keys=False)
    recipe_file.write_text(f"# generated by benchmarks/fallback_vs_nncf.py\n{text}")
    output = base / "temper"
    print(host_line())
    load_before = os.getloadavg()[0]
    print(f"\n=== temper run {recipe_file} --output {output}", file=sys.stderr, flush=True)
    started = time.monotonic()
    rc = subprocess.run([temper, "run", str(recipe_file), "--output", str(output)], cwd=base, env=env,
                        stdout=sys.stderr, stderr=sys.stderr).returncode
    temper_wall = time.monotonic() - started
    if rc in (2, 3) or not (output / "report.json").is_file():
        print(f"error: temper run {recipe_file} exited {rc} without a report", file=sys.stderr)
        return rc if rc in (2, 3) else NO_REPORT
    qwac = run_qwac(recipe_file, cache, base / "nncf", args.max_iterations, args.timeout, env)
    print(report(output, base / "nncf", qwac, recipe_file, cache, args, temper_wall, load_before))
    return 0 if "error" not in qwac else NO_REPORT


def _outcomes(step: dict[str, Any], tuning: Any, qwac: dict[str, Any],
              args: argparse.Namespace) -> tuple[dict[str, str], dict[str, str]]:
    """Each row's time, and its bound and how the search ended."""
    if "error" in qwac:
        qwac_time, validations = f"**{qwac['error']}** ({qwac['wall']:.0f} s)", ""
    else:
        qwac_time = f"{qwac['seconds']:.0f} s (child wall {qwac['wall']:.0f} s)"
        validations = f", {sum(c['items'] > 1 for c in qwac['validations'])} full validations"
    fallback_time = f"{step['seconds']:.0f} s" + (" (cached: first build's)" if step["cached"] else "")
    fallback = ("?" if tuning is None else f"max_trials {tuning.max_trials}, {len(tuning.trials)} trials run, "
                f"budget {'met' if tuning.met else 'missed'}")
    times = {"FP32 baseline": "—", "temper fallback": fallback_time, "NNCF plain INT8 (QWAC's start)": "inside QWAC",
             "NNCF accuracy control": qwac_time}
    bounds = {"FP32 baseline": "", "temper fallback": fallback, "NNCF plain INT8 (QWAC's start)": "",
              "NNCF accuracy control": f"max_num_iterations {args.max_iterations}, ranking_subset_size "
                                       f"{RANKING_ROWS}, timeout {args.timeout:g} s{validations}"}
    return times, bounds


def report(output: Path, nncf_out: Path, qwac: dict[str, Any], recipe_file: Path, cache: Path,
           args: argparse.Namespace, temper_wall: float, load_before: float) -> str:
    """Score every model with the recipe's gate scorer, time them together, and print the table."""
    from temper.validators import report_model
    from temper.validators.census import of_file

    run = report_model.load(output / "report.json")
    manifest = json.loads((output / "manifest.json").read_text())
    step = next(m for m in manifest["models"] if m["id"].startswith(f"{CANDIDATE}/"))
    models = {"FP32 baseline": output / "baseline" / "model.onnx", "temper fallback": output / CANDIDATE / "model.onnx"}
    if (nncf_out / "intermediate_model.onnx").is_file():
        models["NNCF plain INT8 (QWAC's start)"] = nncf_out / "intermediate_model.onnx"
    if "error" not in qwac:
        models["NNCF accuracy control"] = nncf_out / "qwac.onnx"
    with _runner(recipe_file, cache) as runner:
        baseline = runner.baseline()[-1].path
        layout = runner.layout(baseline)
        scorer = runner.scorer
        sample = {k: v[: max(BATCH_SIZES)] for k, v in runner.evaluation_set.features.items()}
        texts = len(runner.evaluation_set)
    scores = {name: scorer.score(path) for name, path in models.items()}
    speed = bench(models, sample, layout, args.duration, args.rounds)
    load_after = os.getloadavg()[0]
    times, bounds = _outcomes(step, run.candidates[CANDIDATE].tuning, qwac, args)
    head = ["model", "time", "bound / outcome", scorer.metric, "drop", f"within {scorer.allowed_drop:.4f}",
            "cosine", "quantized / eligible", *[f"b{b} speedup" for b in BATCH_SIZES]]
    rows = []
    for name, path in models.items():
        s, census = scores[name], of_file(path)
        rows.append([name, times[name], bounds[name], f"{s.metric:.4f}", f"{s.drop:+.4f}",
                     "yes" if s.drop <= scorer.allowed_drop else "**no**", f"{s.cosine:.4f}",
                     f"{census.quantized} / {census.eligible}", *[speed[name][b] for b in BATCH_SIZES]])
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = ["", "### MiniLM static INT8: temper's accuracy fallback against NNCF's accuracy control", "",
             f"Measured {when}; load average (1 min) {load_before:.2f} before, {load_after:.2f} after; temper run "
             f"{temper_wall:.0f} s wall; NNCF child peak RSS {qwac.get('peak_gib', '?')} GiB.", "",
             f"Budget: {scorer.metric} drop at most {scorer.allowed_drop:.4f} from the FP32 baseline's "
             f"{scorer.baseline_metric:.4f} (held-out set, {texts} texts). Speedups: ONNX Runtime "
             f"CPU against the FP32 baseline, {args.rounds} interleaved rounds of {args.duration / args.rounds:.2f} s "
             "per model and batch size, geometric mean of the paired ratios [95% t-interval].", "",
             "| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|",
             *("| " + " | ".join(r) + " |" for r in rows)]
    if "error" not in qwac:
        trail = ", ".join(f"{c['metric']:.4f}" for c in qwac["validations"] if c["items"] > 1)
        lines += ["", f"NNCF's validations on the whole held-out set, in order ({scorer.metric}): {trail}."]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
