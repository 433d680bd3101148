"""What `temper capacity` does once its flags are parsed: the bundle and perf_analyzer checked, the search's
grid from the flags (or the bundle's own settings), then each measured point and the chosen configuration
printed. Kept apart from measure.py, which only parses the flags."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

from rich.table import Table

from temper.artifacts.core.errors import EnvironmentProblem, RecipeError, first_line
from temper.artifacts.core.host import usable_cores
from temper.artifacts.formats.bundle import ServingConfig, read
from temper.artifacts.formats.capacity import Capacity, Point
from temper.artifacts.formats.integrity import Mismatch, check_bundle
from temper.pipeline.capacity import Search
from temper.pipeline.cli.common import err, out


def checked(bundle: Path, protocol: str, perf_analyzer: str) -> tuple[ServingConfig, str]:
    """The bundle's serving config and perf_analyzer's path, each refused in one line."""
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
    return config, tool


def search(config: ServingConfig, p99_ms: float, batch_sizes: str | None, delays_ms: str | None,
           instances: str | None, start_rate: float, max_rate: float, steps: int, rounds: int) -> Search:
    """The grid to search: the flags' lists, else the bundle's settings beside a few common ones."""
    return Search(
        target_ms=p99_ms,
        batch_sizes=_numbers(batch_sizes, "--batch-sizes", int, 1) if batch_sizes else
        list(dict.fromkeys([config.max_batch_size, 4, 16, 64])),
        delays_ms=_numbers(delays_ms, "--delays-ms", float, 0) if delays_ms else
        list(dict.fromkeys([config.max_delay_ms, 0.0, 2.0])),
        instances=_numbers(instances, "--instances", int, 0) if instances else
        list(range(1, min(usable_cores(), 4) + 1)),
        start_rate=min(start_rate, max_rate), ceiling=max_rate, floor=min(1.0, start_rate), steps=steps,
        rounds=rounds)


def tell(point: object) -> None:
    """One measured rate, as it comes."""
    assert isinstance(point, Point)
    err.print(f"  {point.choice.label()}{f', round {point.round}' if point.round else ''}: {point.rate:,.1f} "
              f"req/s offered -> p99 {_ms(point.p99_ms)}, {point.errors} errors: "
              f"{'under' if point.under else 'OVER'}", soft_wrap=True)


def show(measured: Capacity, config: ServingConfig, p99_ms: float, protocol: str, seconds: float, written: Path,
         plot: Path) -> None:
    """Every point measured, then the chosen configuration with its interval and what was written."""
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


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f} us"
