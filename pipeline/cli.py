"""The `temper` command line. Errors are one line and an exit code (2 bad input, 3 environment,
1 a step or candidate failed); `--debug` shows the traceback instead."""

from __future__ import annotations

import importlib.metadata
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text
from typer._click.exceptions import NoArgsIsHelpError  # typer bundles click: `click`'s own classes never match

from artifacts.host import HostProfile, profile
from pipeline.cache import StepCache, default_root
from pipeline.errors import TemperError
from pipeline.loading import LoadedRecipe, load_recipe
from pipeline.runner import ModelRecord, Runner, RunResult

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Recipes in, optimized and gated ONNX models out.")
out = Console()
err = Console(stderr=True)
DEBUG = {"on": False}
COMMAND: dict[str, str | None] = {"name": None}  # the subcommand running, for the line an interruption prints

RecipeArg = Annotated[Path, typer.Argument(help="recipe YAML file", show_default=False)]
CacheOpt = Annotated[Path | None, typer.Option("--cache-dir", help="step cache (default: $TEMPER_CACHE_DIR, else the user cache folder, e.g. ~/.cache/temper)")]


def _show_version(value: bool) -> None:
    """`temper --version`: the installed temper-ml distribution's version, before any command runs."""
    if value:
        print(f"temper {importlib.metadata.version('temper-ml')}")
        raise typer.Exit()


@app.callback()
def _options(
    ctx: typer.Context,
    debug: Annotated[bool, typer.Option("--debug", help="show tracebacks and library warnings")] = False,
    version: Annotated[bool, typer.Option("--version", help="print the version and exit", is_eager=True,
                                          callback=_show_version)] = False,
) -> None:
    DEBUG["on"] = debug
    COMMAND["name"] = ctx.invoked_subcommand
    # Exporters, quantizers and MLflow log and warn advice meant for their own developers; temper reports what
    # matters. Without --debug warnings become log records below the root level: a library's own "once" or
    # "always" filter cannot bring them back.
    logging.captureWarnings(not debug)
    logging.getLogger().setLevel(logging.DEBUG if debug else logging.ERROR)
    # MLflow sets its loggers' levels when it is imported (lazily, after this) from this variable; the
    # setLevel calls cover an MLflow imported already (the tests call main() in-process).
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "DEBUG" if debug else "ERROR")
    for chatty in ("mlflow", "alembic"):
        logging.getLogger(chatty).setLevel(logging.DEBUG if debug else logging.ERROR)


class _Display:
    """Observer that shows the running step (candidate, step, elapsed) and logs each finished one."""

    def __init__(self, progress: Progress) -> None:
        self.progress, self.task = progress, None

    def started(self, chain: str, step: str) -> None:
        if self.task is not None:
            self.progress.remove_task(self.task)
        self.task = self.progress.add_task(f"{chain} › {step}", total=None)

    def note(self, text: str) -> None:
        if self.task is not None:
            self.progress.remove_task(self.task)
        self.task = self.progress.add_task(text, total=None)

    def finished(self, chain: str, record: ModelRecord) -> None:
        note = "cached" if record.cached else f"{record.seconds:.1f}s"
        self.progress.console.print(f"  [green]✓[/] {chain} › {record.step}  [dim]{note}[/]")


TrackingOpt = Annotated[str | None, typer.Option("--tracking-uri", help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db here)")]
RequireOpt = Annotated[list[str] | None, typer.Option("--require", help="exit 1 unless this candidate passed every gate (repeatable)")]


@app.command()
def run(
    recipe: RecipeArg,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="output folder (default: out/<recipe name>)")] = None,
    cache_dir: CacheOpt = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="rebuild every step (results still refresh the cache)")] = False,
    require: RequireOpt = None,
    tracking_uri: TrackingOpt = None,
) -> None:
    """Build the baseline and every candidate, validate them against the recipe's gates, write the output
    folder, and publish the selected candidate when the recipe has a publish section and the gates hold."""
    from pipeline.gating import from_run, precheck, preflight
    from pipeline.outputs import OutputFolder
    from validators import report
    from validators.validation import as_report, validate

    loaded = load_recipe(recipe)
    _known_candidates(loaded, require)
    folder = OutputFolder(output or Path("out") / loaded.recipe.name)
    runner = Runner(loaded, StepCache(cache_dir or default_root(), enabled=not no_cache))
    begin = time.perf_counter()
    verdict = None
    try:
        precheck(runner)  # data and providers, before even the baseline is built
        with _progress() as progress:
            runner.observer = display = _Display(progress)
            preflight(runner, tracking_uri)  # what the baseline alone can tell, before any candidate
            result = runner.run()
            if loaded.recipe.validation is not None:
                verdict = as_report(validate(from_run(runner, result), display.note))
        target = folder.commit(loaded, result, (lambda d: report.write(verdict, d)) if verdict else None)
    finally:
        folder.discard()
        runner.close()
    out.print(_summary(result))
    for c in result.candidates:
        if c.error:
            err.print(Text.assemble(("error: ", "red"), f"candidate {c.name}: {c.error}"), soft_wrap=True)
    if verdict is None:
        out.print(f"wrote {_shown(target)} in {time.perf_counter() - begin:.1f}s (no validate section: nothing gated)")
        passed = {c.name for c in result.candidates if not c.error}
        raise typer.Exit(0 if passed and passed >= set(require or ()) and len(passed) == len(result.candidates) else 1)
    out.print(f"wrote {_shown(target)} in {time.perf_counter() - begin:.1f}s")
    code = _gate_exit(verdict, require)
    if loaded.recipe.publish is not None:
        from pipeline.publishing import publish_run

        done = publish_run(loaded, target, verdict, tracking_uri)
        how = f"reused version {done.version} (same model and recipe)" if done.reused else f"registered version {done.version}"
        out.print(Text.assemble(("published: ", "green"), f"{done.uri} -> {done.name} {how} ({_published_what(verdict)})"),
                  soft_wrap=True)
    raise typer.Exit(code)


@app.command()
def promote(
    name: Annotated[str, typer.Argument(help="registered model name")],
    version: Annotated[str, typer.Argument(help="version to point the alias at")],
    alias: Annotated[str, typer.Option("--alias", help="alias to move, e.g. champion")],
    tracking_uri: TrackingOpt = None,
) -> None:
    """Move an alias (e.g. champion) to a registered version."""
    from artifacts.registry import connect
    from pipeline.errors import RecipeError, first_line

    client = connect(tracking_uri)
    steps = (("NAME", lambda: client.get_registered_model(name)),  # each error names the argument that is wrong
             ("VERSION", lambda: client.get_model_version(name, version)),
             ("--alias", lambda: client.set_registered_model_alias(name, alias, version)))
    for argument, step in steps:
        try:
            step()
        except Exception as exc:
            raise RecipeError(f"models:/{name}/{version}", argument, first_line(exc)) from exc
    out.print(f"models:/{name}@{alias} -> version {version}")


@app.command()
def pull(
    uri: Annotated[str, typer.Argument(help="models:/NAME@ALIAS or models:/NAME/VERSION")],
    dest: Annotated[Path, typer.Option("--dest", help="folder to write the serving bundle into")],
    tracking_uri: TrackingOpt = None,
) -> None:
    """Download a registered version's serving bundle (model, runtime config, report) for deployment."""
    from artifacts.registry import connect, fetch_bundle, resolve_version
    from pipeline.errors import RecipeError, first_line

    client = connect(tracking_uri)
    try:
        name, version = resolve_version(client, uri)
        fetch_bundle(f"models:/{name}/{version}", dest)
    except Exception as exc:
        raise RecipeError(uri, "URI", first_line(exc)) from exc
    tags = client.get_model_version(name, version).tags
    out.print(f"pulled {name} version {version} ({tags.get('precision', '?')}, candidate {tags.get('candidate', '?')}) into {dest}:")
    for item in sorted(dest.iterdir()):
        out.print(f"  {item.name}  {item.stat().st_size:,} bytes")


@app.command("validate")
def validate_cmd(
    recipe: RecipeArg,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="folder an earlier `temper run` wrote (default: out/<recipe name>)")] = None,
    cache_dir: CacheOpt = None,
    require: RequireOpt = None,
) -> None:
    """Re-run validation on an existing output folder (e.g. with new budgets) without rebuilding anything."""
    from pipeline.errors import RecipeError
    from pipeline.gating import from_folder
    from validators import report
    from validators.validation import as_report, validate

    loaded = load_recipe(recipe)
    if loaded.recipe.validation is None:
        raise RecipeError(loaded.file, "validate", "this recipe has no validate section: nothing to check")
    _known_candidates(loaded, require)
    folder = (output or Path("out") / loaded.recipe.name).resolve()
    runner = Runner(loaded, StepCache(cache_dir or default_root()))
    try:
        subject = from_folder(runner, folder)
        with _progress() as progress:
            verdict = as_report(validate(subject, _Display(progress).note))
    finally:
        runner.close()
    report.write(verdict, folder)
    raise typer.Exit(_gate_exit(verdict, require))


@app.command()
def check(recipe: RecipeArg, cache_dir: CacheOpt = None, tracking_uri: TrackingOpt = None) -> None:
    """Validate the recipe and everything it refers to, without building candidates."""
    from pipeline.check import check as run_check

    loaded = load_recipe(recipe)
    runner = Runner(loaded, StepCache(cache_dir or default_root()))
    try:
        for line in run_check(runner, tracking_uri):
            out.print(Text.assemble(("  ✓ ", "green"), line))
    finally:
        runner.close()
    out.print(f"{recipe}: ok")


@app.command()
def sensitivity(
    recipe: RecipeArg,
    candidate: Annotated[str, typer.Option("--candidate", help="candidate with a static quantize step")],
    top: Annotated[int, typer.Option("--top", min=1, help="rows to print")] = 20,
    samples: Annotated[int | None, typer.Option("--samples", min=1, help="calibration samples to measure on (default: the step's fallback.samples, else 64)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the whole ranking as JSON on stdout")] = False,
    cache_dir: CacheOpt = None,
) -> None:
    """Rank a candidate's quantized nodes by how much INT8 hurts them (SQNR on calibration data), without tuning."""
    from pipeline.ranking import rank_candidate

    loaded = load_recipe(recipe)
    runner = Runner(loaded, StepCache(cache_dir or default_root()))
    try:
        with _progress() as progress:
            runner.observer = display = _Display(progress)
            ranking = rank_candidate(runner, candidate, samples)
            display.note("done")
    finally:
        runner.close()
    if as_json:
        print(json.dumps([r.as_dict() for r in ranking], indent=2))
        return
    table = Table(title=f"{candidate}: nodes by INT8 sensitivity (most harmful first)", title_justify="left")
    for col, justify in (("rank", "right"), ("node", "left"), ("op", "left"), ("SQNR dB", "right"), ("output vs float dB", "right")):
        table.add_column(col, justify=justify)
    for index, r in enumerate(ranking[:top], 1):
        table.add_row(str(index), r.node, r.op_type, f"{r.sqnr_db:.1f}", "-" if r.accumulated_db is None else f"{r.accumulated_db:.1f}")
    table.caption = (f"{len(ranking)} quantized nodes; SQNR of the quantized tensors each touches (-200: NaN/Inf where "
                     "the float model has numbers). Keep the top ones in float with exclude_nodes, or let fallback: do it.")
    out.print(table)


@app.command()
def schema() -> None:
    """Print the recipe JSON Schema (for editor completion and validation)."""
    from pipeline.schema import recipe_schema

    print(json.dumps(recipe_schema(), indent=2))


@app.command()
def serve(
    model: Annotated[str, typer.Argument(
        help="serving bundle folder; a run's output folder (its selected model) or OUTPUT/CANDIDATE; "
             "or models:/NAME@ALIAS or models:/NAME/VERSION", show_default=False)],
    host: Annotated[str, typer.Option("--host", help="address to bind; 0.0.0.0 exposes the server beyond this machine")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="TCP port")] = 8000,
    max_body_mb: Annotated[float | None, typer.Option(
        "--max-body-mb", help="refuse larger request bodies with HTTP 413 [default: a full batch of the model's "
                              "inputs as JSON, at least 1 MiB]")] = None,
    max_connections: Annotated[int | None, typer.Option(
        "--max-connections", min=1, help="open HTTP connections at most; one more closes the longest idle one "
                                         "[default: what the open-file limit leaves room for, at most 4096]")] = None,
    grpc_port: Annotated[int | None, typer.Option("--grpc-port", min=1, max=65535, help="also serve KServe v2 gRPC on this port (needs the grpc extra)")] = None,
    tracking_uri: TrackingOpt = None,
) -> None:
    """Serve a bundle over the Open Inference Protocol (KServe v2 REST, and gRPC with --grpc-port): dynamic batching,
    Prometheus /metrics."""
    import tempfile

    from artifacts.bundle import CONFIG, MODEL, config_for
    from artifacts.runtime import Runtime
    from artifacts.server import bind, body_limit
    from artifacts.server import serve as run_server
    from pipeline.errors import EnvironmentProblem, RecipeError, first_line
    from pipeline.outputs import MANIFEST

    if max_body_mb is not None and max_body_mb <= 0:
        raise RecipeError(model, "--max-body-mb", f"must be more than 0, got {max_body_mb}")
    if grpc_port is not None:  # before any loading: missing packages are known now
        if grpc_port == port:
            raise RecipeError(model, "--grpc-port", f"must differ from --port {port}")
        try:
            from artifacts.grpc_server import GrpcServer
        except ImportError as exc:
            raise EnvironmentProblem(f"--grpc-port: {first_line(exc)}") from None
    try:  # before loading or printing anything: a busy port is one line, not a traceback
        sock = bind(host, port)
    except OSError as exc:
        raise EnvironmentProblem(f"--port: cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    with sock, tempfile.TemporaryDirectory(prefix="temper-serve-") as tmp:
        config = None  # from the bundle's runtime.json
        if model.startswith("models:/"):
            from artifacts.registry import connect, fetch_bundle, resolve_version

            try:
                name, version = resolve_version(connect(tracking_uri), model)
                folder = fetch_bundle(f"models:/{name}/{version}", Path(tmp) / "bundle")
            except Exception as exc:  # unknown name/alias/version, unreachable store, no bundle inside
                raise RecipeError(model, "MODEL", first_line(exc)) from exc
        else:
            folder = Path(model)
            output = folder if (folder / MANIFEST).is_file() else folder.parent  # a run's output, or a model in it
            if not (folder / CONFIG).is_file() and not (folder.is_dir() and (output / MANIFEST).is_file()):
                raise RecipeError(model, "MODEL", f"neither a serving bundle folder ({MODEL} + {CONFIG}), a run's "
                                  "output folder or a model in one, nor a models:/NAME@ALIAS or /NAME/VERSION URI")
            if not (folder / CONFIG).is_file():  # unpublished: served with the options publishing would give it
                report_file = output / "report.json"
                try:
                    report = json.loads(report_file.read_text()) if report_file.is_file() else {}
                    if folder == output:  # the run's selection: the baseline when no candidate passed
                        if "selected" not in report:
                            raise ValueError("report.json names no selected model; serve OUTPUT/CANDIDATE")
                        folder = output / report["selected"]
                    recipe = json.loads((output / MANIFEST).read_text())["recipe"]["resolved"]
                    publish = recipe.get("publish") or {}
                    name = (publish.get("mlflow") or {}).get("registered_model") or recipe["name"]
                    config = config_for(folder / MODEL, name, measured_on=report.get("host"),
                                        **(publish.get("serving") or {}))
                except Exception as exc:  # a failed candidate (no model), a damaged manifest or report
                    raise RecipeError(model, "MODEL", f"cannot serve it from its run: {first_line(exc)}") from exc
        try:
            runtime = Runtime(folder, config=config)
        except Exception as exc:  # an invalid runtime.json, a model onnxruntime cannot load
            raise RecipeError(model, "MODEL", f"cannot load the bundle: {first_line(exc)}") from exc
        if runtime.host_warning:  # the root logger is at ERROR without --debug: the log line alone goes unseen
            err.print(Text.assemble(("warning: ", "yellow"), runtime.host_warning), soft_wrap=True)
        name = runtime.config.name
        max_body = int(max_body_mb * 1024 * 1024) if max_body_mb else body_limit(runtime.config)
        out.print(f"serving {name} ({runtime.engine}) at http://{host}:{sock.getsockname()[1]}/v2/models/{name} "
                  "once warm (GET /v2/health/ready answers 200); Ctrl-C stops", soft_wrap=True)
        grpc_server = None
        if grpc_port is not None:  # shares the runtime: ModelInfer answers UNAVAILABLE until the warm-up is done
            grpc_server = GrpcServer(runtime, host, grpc_port, max_body)
            try:
                grpc_server.start()
            except OSError as exc:
                raise EnvironmentProblem(f"--grpc-port: {exc}") from None
            out.print(f"serving {name} over gRPC (KServe v2 GRPCInferenceService) at {host}:{grpc_port}", soft_wrap=True)
        try:
            run_server(runtime, sock, max_body, max_connections)
        finally:
            if grpc_server is not None:
                grpc_server.stop()


@app.command("export-triton")
def export_triton(
    model: Annotated[str, typer.Argument(help="a serving bundle folder or models:/NAME@ALIAS")],
    dest: Annotated[Path, typer.Option("--dest", help="Triton model repository to write into")],
    instances: Annotated[int, typer.Option("--instances", min=1, help="model instances per device")] = 1,
    kind: Annotated[str, typer.Option("--kind", help="KIND_AUTO, KIND_GPU or KIND_CPU")] = "KIND_AUTO",
    tracking_uri: TrackingOpt = None,
) -> None:
    """Write a Triton model repository (config.pbtxt with dynamic batching and warm-up) for a published model."""
    import tempfile

    from artifacts.registry import connect, fetch_bundle, resolve_version
    from artifacts.triton import export_repository
    from pipeline.errors import RecipeError, first_line

    with tempfile.TemporaryDirectory() as tmp:
        try:
            folder = Path(model)
            if model.startswith("models:/"):
                name, version = resolve_version(connect(tracking_uri), model)
                folder = fetch_bundle(f"models:/{name}/{version}", Path(tmp) / "bundle")
            written = export_repository(folder, dest, instances=instances, kind=kind)
        except Exception as exc:  # not a bundle, an unknown name or alias, a bad --kind
            raise RecipeError(model, "MODEL", first_line(exc)) from exc
    out.print(f"wrote Triton model {written.name} to {dest}:")
    for item in sorted(written.rglob("*")):
        if item.is_file():
            out.print(f"  {item.relative_to(dest)}  {item.stat().st_size:,} bytes")


def _published_what(verdict: dict) -> str:
    return f"candidate {verdict['selected']}" if verdict["passed"] else "the FP32 baseline: no candidate passed"


def _progress() -> Progress:
    return Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=err, transient=True)


def _known_candidates(loaded: LoadedRecipe, names: list[str] | None) -> None:
    """A required name is a candidate, or a searched candidate (then one of its trials must pass)."""
    from pipeline.errors import RecipeError

    known = [*loaded.recipe.candidates, *loaded.searches]
    for name in names or ():
        if name not in known:
            raise RecipeError(loaded.file, "--require", f"no candidate named '{name}'; candidates: {', '.join(known)}")


def _gate_exit(verdict: dict, require: list[str] | None) -> int:
    """Print the gate table and the selection (the baseline when no candidate passed); 0 unless a
    `--require`d candidate did not pass."""
    out.print(_gate_table(verdict))
    searches = verdict["searches"]
    missed = [name for name in require or ()
              if not any(verdict["candidates"][n]["passed"] for n in searches.get(name, {"trials": [name]})["trials"])]
    for name, c in verdict["candidates"].items():
        tuning = c["tuning"]
        if tuning and not tuning["met"]:
            best = tuning["trials"][tuning["best"]]
            err.print(Text.assemble(("fallback: ", "red"), f"{name} missed the budget after {len(tuning['trials'])} trials: "
                                    f"best {tuning['metric']} drop {best['drop']:+.4f} (allowed {tuning['allowed_drop']:.4f}) "
                                    f"with {len(best['float_nodes'])} nodes in float; that model is kept, every trial is in "
                                    "report.md. Raise fallback.max_trials or the budget."), soft_wrap=True)
    out.print(Text.assemble(("selected: ", "green"), verdict["selected"]))
    if verdict["selection_reason"]:
        out.print(verdict["selection_reason"], soft_wrap=True)
    for name in missed:
        err.print(Text.assemble(("gates failed: ", "red"), f"required candidate {name} did not pass"))
    return 1 if missed else 0


def _gate_table(verdict: dict) -> Table:
    from validators.report import speedup_text

    table = Table(title="gates", title_justify="left")
    metric = verdict["metric"]
    for col in ("candidate", "verdict", metric or "metric", "drop", "speedup", "failed gates"):
        table.add_column(col, no_wrap=col != "failed gates")
    for name, c in verdict["candidates"].items():
        largest = max(c["throughput"], key=lambda m: m["batch_size"]) if c["throughput"] else None
        table.add_row(
            name, "[green]pass[/]" if c["passed"] else "[red]FAIL[/]",
            f"{c['metric']:.4f}" if c["metric"] is not None else "-",
            f"{c['drop']:+.4f}" if c["drop"] is not None else "-",
            Text(speedup_text(largest)) if largest else "-",
            Text("\n".join(g["name"] for g in c["gates"] if not g["passed"]) or "-"),
        )
    if metric:
        table.caption = (f"baseline {metric} {verdict['baseline']['metric']:.4f}, allowed drop "
                         f"{verdict['allowed_drop']:.4f}; speedup at the largest batch size with its confidence interval; "
                         f"measured on {HostProfile.model_validate(verdict['host']).summary()}; details in report.md")
    return table


@app.command()
def bench(
    model: Annotated[Path, typer.Argument(help="ONNX model file", show_default=False)],
    batch_sizes: Annotated[str, typer.Option("--batch-sizes", help="comma-separated, e.g. 1,8,32")] = "1,8,32",
    provider: Annotated[str, typer.Option("--provider", help="cpu, cuda or tensorrt")] = "cpu",
    duration: Annotated[float, typer.Option("--duration", help="timed seconds per batch size")] = 3.0,
    warmup: Annotated[float, typer.Option("--warmup", help="warm-up seconds per batch size")] = 0.5,
    dim: Annotated[list[str] | None, typer.Option("--dim", help="NAME=SIZE for a symbolic dim other than the batch dim (repeatable)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print a JSON list of measurements on stdout")] = False,
) -> None:
    """Measure samples/s and latency percentiles of one model at each batch size, on random inputs.

    Integer inputs get random values in [0, 100): benchmark token-id models on real data via `temper run`.
    """
    import onnx

    from pipeline.errors import OptionError, RecipeError, first_line
    from pipeline.onnx_io import load_structure
    from validators.throughput import PROVIDERS, batch_of, fits_in_memory, measure, random_inputs

    file = str(model)
    try:
        sizes = [int(s) for s in batch_sizes.split(",")]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise RecipeError(file, "--batch-sizes", f"expected positive integers separated by commas, got '{batch_sizes}'")
    if provider not in PROVIDERS:
        raise RecipeError(file, "--provider", f"'{provider}' is not one of {', '.join(PROVIDERS)}")
    if duration <= 0:
        raise RecipeError(file, "--duration", f"must be more than 0 seconds, got {duration}")
    if warmup < 0:
        raise RecipeError(file, "--warmup", f"must be 0 seconds or more, got {warmup}")
    given: dict[str, int] = {}
    for item in dim or []:
        name, _, value = item.partition("=")
        if not name or not value.isdigit() or int(value) < 1:
            raise RecipeError(file, "--dim", f"expected NAME=SIZE with SIZE a positive integer, got '{item}'")
        given[name] = int(value)
    if not model.is_file():
        raise RecipeError(file, "MODEL", "file not found")
    try:
        onnx.checker.check_model(file)
        structure = load_structure(model)
    except Exception as exc:
        raise RecipeError(file, "MODEL", f"not a valid ONNX model: {first_line(exc)}") from None
    try:
        one_row = random_inputs(structure, 1, given)
        for size in sizes:  # a size that cannot fit is refused before anything is allocated for it
            if (problem := fits_in_memory(one_row, size)) is not None:
                raise RecipeError(file, "--batch-sizes", problem)
        sample = random_inputs(structure, max(sizes), given)
        for size in sizes:  # every size is checked before any time goes into measuring
            batch_of(structure, sample, size)
    except OptionError as exc:
        raise RecipeError(file, exc.key, exc.message) from None
    except ValueError as exc:
        raise RecipeError(file, "--batch-sizes", str(exc)) from None

    results = []
    for size in sizes:
        try:
            with err.status(f"batch size {size} on {provider}"):
                results.append(measure(model, sample, size, provider, duration, warmup))
        except TemperError:
            raise
        except Exception as exc:  # onnxruntime's error classes share no base; --debug keeps the cause
            raise RecipeError(file, "MODEL", f"onnxruntime cannot run it at batch size {size}: {first_line(exc)}") from exc
    if as_json:
        print(json.dumps([m.as_dict() for m in results], indent=2))
        return
    table = Table(title=f"temper bench: {model.name} on {provider}", title_justify="left")
    for col in ("batch", "samples/s", "p50 ms", "p90 ms", "p95 ms", "p99 ms", "peak RSS MB"):
        table.add_column(col, justify="right")
    for m in results:
        quantiles = (f"{m.latency_ms[p]:.4g}" for p in ("p50", "p90", "p95", "p99"))
        table.add_row(str(m.batch_size), f"{m.samples_per_s:,.1f}", *quantiles, f"{m.peak_rss_mb:,.0f}")
    table.caption = f"peak RSS: the whole process, not the model alone; measured on {profile().summary()}"
    out.print(table)


def _summary(result: RunResult) -> Table:
    table = Table(title="temper run", title_justify="left")
    for col, justify in (("model", "left"), ("status", "left"), ("size", "right"), ("steps (time)", "left"), ("total", "right")):
        table.add_column(col, justify=justify)
    rows = [("baseline", result.baseline, None)]
    rows += [(c.name, c.records, c.error) for c in result.candidates]
    for name, records, error in rows:
        steps = ", ".join(f"{r.step} {r.seconds:.1f}s{'*' if r.cached else ''}" for r in records)
        size = f"{records[-1].bytes / 1024:,.0f} KiB" if records and not error else "-"
        status = "[red]failed[/]" if error else "ok"
        table.add_row(name, status, size, steps, f"{sum(r.seconds for r in records):.1f}s")
    table.caption = "* cached: time of the original build"
    return table


def _shown(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


class _Interrupted(BaseException):
    """Ctrl-C or SIGTERM (a CI cancel). Not a KeyboardInterrupt: typer turns that into a silent exit 130
    and user-code guards into a bad-input error; this one reaches main() through every finally block."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _interrupt(signum: int, frame: object) -> None:
    raise _Interrupted(signum)


def main() -> None:
    """Run the CLI with temper's exit codes: usage errors and bad input 2, environment 3, interrupts 128 + signal."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # recipes load local models; never reach for a hub
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # temper shows its own progress
    previous = {each: signal.signal(each, _interrupt) for each in (signal.SIGINT, signal.SIGTERM)
                if signal.getsignal(each) is not signal.SIG_IGN}  # ignored by the parent (`nohup`, `cmd &`): stays so
    try:
        code = app(standalone_mode=False)  # returns the code of a typer.Exit raised by a command
    except _Interrupted as exc:
        from pipeline.outputs import COMMITTED

        if COMMAND["name"] == "serve":  # how a server is stopped: it drained and shut down, a normal end
            err.print("stopped")
            sys.exit(0)
        if COMMAND["name"] != "run":
            err.print("interrupted")
        elif COMMITTED:
            err.print(Text(f"interrupted after writing {_shown(COMMITTED[-1])}"), soft_wrap=True)
        else:
            err.print("interrupted: nothing was written to the output folder")
        sys.exit(128 + exc.signum)
    except TemperError as exc:
        if DEBUG["on"]:
            raise
        err.print(Text.assemble(("error: ", "red"), str(exc)), soft_wrap=True)
        sys.exit(exc.exit_code)
    except NoArgsIsHelpError as exc:  # bare `temper`: the help, as the usage error it is
        exc.show()
        sys.exit(2)
    except typer.TyperException as exc:  # typer's own copy of click's errors: an unknown option, a bad value...
        ctx = getattr(exc, "ctx", None)
        hint = f" (see {ctx.command_path} --help)" if ctx is not None else ""
        err.print(Text.assemble(("error: ", "red"), " ".join(exc.format_message().split()) + hint), soft_wrap=True)
        sys.exit(2)
    finally:
        for each, handler in previous.items():
            signal.signal(each, handler)
    sys.exit(code if isinstance(code, int) else 0)
