"""`temper bench`: one model's samples/s and latency at each batch size, on random inputs."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated

import numpy as np
import typer
from rich.table import Table

from temper.artifacts.core.errors import TemperError
from temper.artifacts.core.host import profile
from temper.artifacts.engines.providers import PROVIDERS
from temper.pipeline.cli.common import app, err, number, opens_sessions, out

MAX_SECONDS = 3600  # an hour per batch size: more is a typo (or `inf`, which never ends)


@app.command()
@opens_sessions
def bench(
    model: Annotated[Path, typer.Argument(help="ONNX model file", show_default=False)],
    batch_sizes: Annotated[str, typer.Option("--batch-sizes", help="comma-separated, e.g. 1,8,32")] = "1,8,32",
    provider: Annotated[str, typer.Option("--provider", help=" | ".join(PROVIDERS))] = "cpu",
    duration: Annotated[float, number("--duration", "timed seconds per batch size", 0, MAX_SECONDS, above=True)] = 3.0,
    warmup: Annotated[float, number("--warmup", "warm-up seconds per batch size", 0, MAX_SECONDS)] = 0.5,
    dim: Annotated[list[str] | None, typer.Option(
        "--dim", help="NAME=SIZE for a symbolic dim other than the batch dim (repeatable)")] = None,
    scalar: Annotated[list[str] | None, typer.Option(
        "--value", help="INPUT=NUMBER: a scalar input's value in every call, e.g. sr=16000 (repeatable)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print a JSON list of measurements on stdout")] = False,
) -> None:
    """Measure samples/s and latency percentiles of one model at each batch size, on random inputs.

    Integer inputs get random values in [0, 100): benchmark token-id models on real data via `temper run`.
    Each input's batch axis is the one named like the first input's batch dim, else 0; a scalar input
    (shape []) gets one random value per call, or the one --value gives.
    The session is the one `temper serve` would run: threads chosen once by a batch-1 timing (all
    usable cores or 1), idle threads sleeping; --json records its settings with each figure.
    """
    import onnx

    from temper.artifacts.core.errors import OptionError, RecipeError, first_line
    from temper.artifacts.core.onnx_io import dims, load_structure
    from temper.validators.throughput import (
        batch_of,
        fits_in_memory,
        graph_layout,
        measure,
        random_inputs,
        tuned_session,
    )

    file = str(model)
    try:
        sizes = [int(s) for s in batch_sizes.split(",")]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise RecipeError(file, "--batch-sizes", f"expected positive integers separated by commas, got '{batch_sizes}'")
    if provider not in PROVIDERS:
        raise RecipeError(file, "--provider", f"'{provider}' is not one of {', '.join(PROVIDERS)}")
    given: dict[str, int] = {}
    for item in dim or []:
        name, _, value = item.partition("=")
        if not name or not value.isdecimal() or int(value) < 1:  # isdigit() passes '²', which int() refuses
            raise RecipeError(file, "--dim", f"expected NAME=SIZE with SIZE a positive integer, got '{item}'")
        given[name] = int(value)
    texts: dict[str, str] = {}
    for item in scalar or []:
        name, _, number = item.partition("=")
        try:
            float(number)
        except ValueError:
            raise RecipeError(file, "--value", f"expected INPUT=NUMBER, got '{item}'") from None
        texts[name] = number
    if not model.is_file():
        raise RecipeError(file, "MODEL", "file not found")
    try:
        onnx.checker.check_model(file)
        structure = load_structure(model)
    except Exception as exc:
        raise RecipeError(file, "MODEL", f"not a valid ONNX model: {first_line(exc)}") from exc
    scalars = [name for name, shape in dims(structure).items() if not shape]
    stray = [name for name in texts if name not in scalars]
    if stray:
        raise RecipeError(file, "--value", f"'{stray[0]}' is not a scalar input of the model "
                                           f"(its scalar inputs: {', '.join(scalars) or 'none'})")
    types = {v.name: v.type.tensor_type.elem_type for v in structure.graph.input}
    values: dict[str, float] = {}
    for name, text in texts.items():
        try:
            values[name] = _held(name, text, onnx.helper.tensor_dtype_to_np_dtype(types[name]))
        except ValueError as exc:
            raise RecipeError(file, "--value", f"'{name}={text}': {exc}") from None
    layout = graph_layout(structure, values)
    try:
        one_row = random_inputs(structure, 1, given, layout)
        for size in sizes:  # a size that cannot fit is refused before anything is allocated for it
            if (problem := fits_in_memory(one_row, size)) is not None:
                raise RecipeError(file, "--batch-sizes", problem)
        sample = random_inputs(structure, max(sizes), given, layout)
        for size in sizes:  # every size is checked before any time goes into measuring
            batch_of(structure, sample, size, layout)
    except OptionError as exc:
        raise RecipeError(file, exc.key, exc.message) from None
    except ValueError as exc:
        raise RecipeError(file, "--batch-sizes", str(exc)) from None

    results = []
    session = None  # made once: threads chosen as serving chooses them (validators.throughput.tuned_session)
    for size in sizes:
        try:
            with err.status(f"batch size {size} on {provider}"):
                session = session or tuned_session(model, provider, sample, layout)
                results.append(measure(model, sample, size, provider, duration, warmup, session=session,
                                       layout=layout))
        except TemperError:
            raise
        except Exception as exc:  # onnxruntime's error classes share no base; --debug keeps the cause
            raise RecipeError(file, "MODEL",
                              f"onnxruntime cannot run it at batch size {size}: {first_line(exc)}") from exc
    if as_json:
        print(json.dumps([m.as_dict() for m in results], indent=2))
        return
    table = Table(title=f"temper bench: {model.name} on {provider}", title_justify="left")
    for col in ("batch", "samples/s", "p50 ms", "p90 ms", "p95 ms", "p99 ms", "peak RSS MB"):
        table.add_column(col, justify="right")
    for m in results:
        quantiles = (f"{m.latency_ms[p]:.4g}" for p in ("p50", "p90", "p95", "p99"))
        table.add_row(str(m.batch_size), f"{m.samples_per_s:,.1f}", *quantiles, f"{m.peak_rss_mb:,.0f}")
    settings = results[0].session or {}
    engine = (f"OpenVINO: computing in {settings.get('inference_precision')} (read back), "
              f"{settings.get('num_threads')} threads, {settings.get('num_streams')} stream, "
              f"{settings.get('performance_hint')} hint" if "inference_precision" in settings else
              f"session: {settings.get('intra_op_threads')} intra-op threads, spinning "
              f"{'on' if settings.get('spinning') else 'off'}, graph optimization {settings.get('graph_optimization')}")
    table.caption = (f"peak RSS: the whole process, not the model alone; measured on {profile().summary()}; "
                     f"{engine} (as temper serve runs it)")
    out.print(table)


def _held(name: str, text: str, dtype: np.dtype) -> float:
    """The number `text` as the scalar input `name` of `dtype` holds it exactly; ValueError saying why it cannot
    (NaN or an infinity, a fraction for an integer input, a number past the type's range)."""
    number = float(text)
    if not math.isfinite(number):  # 1e400 too: float() makes it an infinity
        raise ValueError("not a finite number; give the value the model is run with, e.g. sr=16000")
    if dtype.kind == "f":
        if abs(number) > float(np.finfo(dtype).max):
            raise ValueError(f"outside {dtype.name}'s range (at most {float(np.finfo(dtype).max):g} either way)")
        return number
    exact = int(text) if text.strip().lstrip("+-").isdecimal() else (int(number) if number.is_integer() else None)
    if exact is None:  # numpy would cut 1.5 to 1 without a word
        raise ValueError(f"'{name}' is an {dtype.name} input: give an integer")
    low, high = (0, 1) if dtype.kind == "b" else (int(np.iinfo(dtype).min), int(np.iinfo(dtype).max))
    if not low <= exact <= high:
        raise ValueError(f"outside {dtype.name}'s range [{low}, {high}]")
    return exact


def _numbers(text: str, flag: str, cast: type, low: float) -> list:
    """A comma-separated list of numbers, each at least `low`, in the order given, without repeats."""
    try:
        values = [cast(part) for part in text.split(",") if part.strip()]
    except ValueError:
        values = []
    if not values or any(not math.isfinite(v) or v < low for v in values):
        from temper.artifacts.core.errors import RecipeError

        raise RecipeError(text, flag, f"expected numbers of at least {low:g} separated by commas, got '{text}'")
    return list(dict.fromkeys(values))


@app.command()
@opens_sessions
def capacity(
    bundle: Annotated[Path, typer.Argument(
        help="serving bundle folder (model.onnx and runtime.json: what `temper pull` writes, or a version folder "
             "of a repository `temper export-triton` wrote)", show_default=False)],
    p99_ms: Annotated[float, number("--p99-ms", "the latency target: p99 in milliseconds, client side", 0,
                                    above=True)],
    batch_sizes: Annotated[str | None, typer.Option(
        "--batch-sizes", help="max batch sizes to try, comma-separated; default: the bundle's, 4, 16, 64",
        show_default=False)] = None,
    delays_ms: Annotated[str | None, typer.Option(
        "--delays-ms", help="max queue delays to try (ms); default: the bundle's, 0, 2", show_default=False)] = None,
    instances: Annotated[str | None, typer.Option(
        "--instances", help="worker instances to try (0: in the server's process); default: 1 up to the usable "
                            "cores, at most 4", show_default=False)] = None,
    rounds: Annotated[int, number("--rounds", "times the chosen configuration's knee is measured again, each on "
                                              "a fresh server, for its interval", 1, 20)] = 2,
    seconds: Annotated[float, number("--seconds", "seconds of requests per rate", 0.5, 600)] = 3.0,
    steps: Annotated[int, number("--steps", "bisections between the last rate under the target and the first "
                                            "over it", 0, 10)] = 3,
    start_rate: Annotated[float, number("--start-rate", "first request rate offered, requests/s", 0.1)] = 20.0,
    max_rate: Annotated[float, number("--max-rate", "highest request rate offered, requests/s", 1)] = 20_000.0,
    protocol: Annotated[str, typer.Option("--protocol", help="http or grpc (grpc needs the grpc extra)")] = "http",
    perf_analyzer: Annotated[str, typer.Option(
        "--perf-analyzer", help="Triton's perf_analyzer: a path, or a command on PATH (`make perf-analyzer` "
                                "installs one as .cache/perf_analyzer/run)")] = "perf_analyzer",
) -> None:
    """Measure the highest request rate the bundle serves behind `temper serve` with p99 under --p99-ms, across
    max batch size, max queue delay and instances (a small one-dimension-at-a-time search, perf_analyzer's
    open-loop request rates), with the knee repeated for an interval. Writes capacity.json (the chosen
    configuration, which `temper serve` and `temper export-triton` then use) and capacity.png into the bundle."""
    import shutil

    from temper.artifacts.core.errors import EnvironmentProblem, RecipeError, first_line
    from temper.artifacts.core.host import usable_cores
    from temper.artifacts.formats.bundle import read
    from temper.artifacts.formats.capacity import PLOT, write
    from temper.artifacts.formats.integrity import Mismatch, check_bundle
    from temper.pipeline.capacity import Search, measure
    from temper.pipeline.capacity_load import Load
    from temper.validators.report_plots import capacity_plot

    if protocol not in ("http", "grpc"):
        raise RecipeError(str(bundle), "--protocol", f"'{protocol}' is not http or grpc")
    try:
        config = read(bundle)
        unchecked = check_bundle(bundle, "pull the bundle again")
    except Mismatch as exc:
        raise RecipeError(str(exc.file), "", str(exc)) from None
    except (OSError, ValueError) as exc:
        raise RecipeError(str(bundle), "BUNDLE", f"{first_line(exc)}: `temper pull` a published model, or measure "
                                                 "a version folder `temper export-triton` wrote") from None
    if unchecked:
        err.print(f"warning: {unchecked}", soft_wrap=True)
    tool = shutil.which(perf_analyzer)
    if tool is None:
        raise EnvironmentProblem(f"--perf-analyzer: {perf_analyzer} not found: `make perf-analyzer` installs Triton's "
                                 "perf_analyzer into .cache/perf_analyzer/ (pass --perf-analyzer "
                                 ".cache/perf_analyzer/run), or run this in Triton's SDK image")
    search = Search(
        target_ms=p99_ms,
        batch_sizes=_numbers(batch_sizes, "--batch-sizes", int, 1) if batch_sizes else
        list(dict.fromkeys([config.max_batch_size, 4, 16, 64])),
        delays_ms=_numbers(delays_ms, "--delays-ms", float, 0) if delays_ms else
        list(dict.fromkeys([config.max_delay_ms, 0.0, 2.0])),
        instances=_numbers(instances, "--instances", int, 0) if instances else
        list(range(1, min(usable_cores(), 4) + 1)),
        start_rate=min(start_rate, max_rate), ceiling=max_rate, floor=min(1.0, start_rate), steps=steps,
        rounds=rounds)
    load = Load(tool, protocol, seconds)

    def tell(point: object) -> None:
        from temper.artifacts.formats.capacity import Point

        assert isinstance(point, Point)
        err.print(f"  {point.choice.label()}{f', round {point.round}' if point.round else ''}: {point.rate:,.1f} "
                  f"req/s offered -> p99 {_ms(point.p99_ms)}, {point.errors} errors: "
                  f"{'under' if point.under else 'OVER'}", soft_wrap=True)

    measured = measure(bundle, config, search, load, tell)
    written = write(bundle, measured)
    plot = capacity_plot(measured, bundle / PLOT)
    table = Table(title=f"temper capacity: {config.name}, p99 target {p99_ms:g} ms", title_justify="left")
    for col in ("batch", "delay ms", "instances", "round", "offered/s", "sent/s", "p50 ms", "p99 ms", "queue us",
                "errors", "p99 under"):
        table.add_column(col, justify="right")
    for p in measured.points:
        table.add_row(str(p.choice.max_batch_size), f"{p.choice.max_delay_ms:g}", str(p.choice.instances),
                      str(p.round), f"{p.rate:,.1f}", f"{p.sent:,.1f}", _ms(p.p50_ms), _ms(p.p99_ms),
                      "-" if p.queue_us is None else f"{p.queue_us:,.0f}", str(p.errors), "yes" if p.under else "no")
    table.caption = f"{measured.tool} over {protocol}, {seconds:g} s of Poisson arrivals per rate; measured on " \
                    f"{measured.measured_on.summary()}"
    out.print(table)
    memory = "-" if measured.memory_bytes is None else f"{measured.memory_bytes / 2**20:,.0f} MiB"
    out.print(f"chosen: {measured.chosen.label()}: {measured.rate:,.1f} requests/s with p99 under {p99_ms:g} ms "
              f"(knees {', '.join(f'{k:,.1f}' for k in measured.knees)}; 95% interval {measured.interval[0]:,.1f}-"
              f"{measured.interval[1]:,.1f}); at the knee p99 {measured.p99_ms:.3g} ms, queue "
              f"{_us(measured.queue_us)}, {measured.in_flight:.3g} requests in flight, {memory}", soft_wrap=True)
    out.print(f"wrote {written} and {plot}: temper serve and temper export-triton use the chosen configuration",
              soft_wrap=True)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f} us"
