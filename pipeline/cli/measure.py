"""`temper bench`: one model's samples/s and latency at each batch size, on random inputs; `temper capacity`:
the highest request rate a bundle serves under a p99 target. Each command parses its flags and hands over
(pipeline/cli/benching.py, pipeline/cli/capacity_view.py)."""

from __future__ import annotations

from temper.pipeline.cli.common import app, opens_sessions
from temper.pipeline.cli.measure_options import (
    AsJson,
    BenchModel,
    BenchProvider,
    BenchSizes,
    Bundle,
    Dims,
    Duration,
    MaxRate,
    P99Ms,
    PerfAnalyzer,
    Protocol,
    Rounds,
    Seconds,
    StartRate,
    Steps,
    TriedDelays,
    TriedInstances,
    TriedSizes,
    Values,
    Warmup,
)


@app.command()
@opens_sessions
def bench(
    model: BenchModel,
    batch_sizes: BenchSizes = "1,8,32",
    provider: BenchProvider = "cpu",
    duration: Duration = 3.0,
    warmup: Warmup = 0.5,
    dim: Dims = None,
    scalar: Values = None,
    as_json: AsJson = False,
) -> None:
    """Measure samples/s and latency percentiles of one model at each batch size, on random inputs.

    Integer inputs get random values in [0, 100): benchmark token-id models on real data via `temper run`.
    Each input's batch axis is the one named like the first input's batch dim, else 0; a scalar input
    (shape []) gets one random value per call, or the one --value gives.
    The session is the one `temper serve` would run: threads chosen once by a batch-1 timing (all
    usable cores or 1), idle threads sleeping; --json records its settings with each figure.
    """
    from temper.pipeline.cli import benching

    plan = benching.planned(model, batch_sizes, provider, dim or [], scalar or [])
    benching.show(benching.measured(model, plan, duration, warmup), model, provider, as_json)


@app.command()
@opens_sessions
def capacity(
    bundle: Bundle,
    p99_ms: P99Ms,
    batch_sizes: TriedSizes = None,
    delays_ms: TriedDelays = None,
    instances: TriedInstances = None,
    rounds: Rounds = 2,
    seconds: Seconds = 3.0,
    steps: Steps = 3,
    start_rate: StartRate = 20.0,
    max_rate: MaxRate = 20_000.0,
    protocol: Protocol = "http",
    perf_analyzer: PerfAnalyzer = "perf_analyzer",
) -> None:
    """Measure the highest request rate the bundle serves behind `temper serve` with p99 under --p99-ms, across
    max batch size, max queue delay and instances (a small one-dimension-at-a-time search, perf_analyzer's
    open-loop request rates), with the knee repeated for an interval. Writes capacity.json (the chosen
    configuration, which `temper serve` and `temper export-triton` then use) and capacity.png into the bundle."""
    from temper.artifacts.formats.capacity import PLOT, write
    from temper.pipeline.capacity import measure
    from temper.pipeline.capacity_load import Load
    from temper.pipeline.cli import capacity_view as view
    from temper.validators.report_plots import capacity_plot

    config, tool = view.checked(bundle, protocol, perf_analyzer)
    grid = view.search(config, p99_ms, batch_sizes, delays_ms, instances, start_rate, max_rate, steps, rounds)
    measured = measure(bundle, config, grid, Load(tool, protocol, seconds), view.tell)
    view.show(measured, config, p99_ms, protocol, seconds, write(bundle, measured), capacity_plot(measured,
                                                                                                 bundle / PLOT))
