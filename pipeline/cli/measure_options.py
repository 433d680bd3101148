"""The flags of measure.py's commands (`temper bench`, `temper capacity`) as typer options, kept apart so that
each command is what it does: parse, then hand over (pipeline/cli/benching.py, pipeline/cli/capacity_view.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from temper.artifacts.engines.providers import PROVIDERS
from temper.pipeline.cli.common import number

MAX_SECONDS = 3600  # an hour per batch size: more is a typo (or `inf`, which never ends)

# temper bench
BenchModel = Annotated[Path, typer.Argument(help="ONNX model file", show_default=False)]
BenchSizes = Annotated[str, typer.Option("--batch-sizes", help="comma-separated, e.g. 1,8,32")]
BenchProvider = Annotated[str, typer.Option("--provider", help=" | ".join(PROVIDERS))]
Duration = Annotated[float, number("--duration", "timed seconds per batch size", 0, MAX_SECONDS, above=True)]
Warmup = Annotated[float, number("--warmup", "warm-up seconds per batch size", 0, MAX_SECONDS)]
Dims = Annotated[list[str] | None, typer.Option(
    "--dim", help="NAME=SIZE for a symbolic dim other than the batch dim (repeatable)")]
Values = Annotated[list[str] | None, typer.Option(
    "--value", help="INPUT=NUMBER: a scalar input's value in every call, e.g. sr=16000 (repeatable)")]
AsJson = Annotated[bool, typer.Option("--json", help="print a JSON list of measurements on stdout")]

# temper capacity
Bundle = Annotated[Path, typer.Argument(
    help="serving bundle folder (model.onnx and runtime.json: what `temper pull` writes, or a version folder "
         "of a repository `temper export-triton` wrote)", show_default=False)]
P99Ms = Annotated[float, number("--p99-ms", "the latency target: p99 in milliseconds, client side", 0,
                                above=True)]
TriedSizes = Annotated[str | None, typer.Option(
    "--batch-sizes", help="max batch sizes to try, comma-separated; default: the bundle's, 4, 16, 64",
    show_default=False)]
TriedDelays = Annotated[str | None, typer.Option(
    "--delays-ms", help="max queue delays to try (ms); default: the bundle's, 0, 2", show_default=False)]
TriedInstances = Annotated[str | None, typer.Option(
    "--instances", help="worker instances to try (0: in the server's process); default: 1 up to the usable "
                        "cores, at most 4", show_default=False)]
Rounds = Annotated[int, number("--rounds", "times the chosen configuration's knee is measured again, each on "
                                          "a fresh server, for its interval", 1, 20)]
Seconds = Annotated[float, number("--seconds", "seconds of requests per rate", 0.5, 600)]
Steps = Annotated[int, number("--steps", "bisections between the last rate under the target and the first "
                                        "over it", 0, 10)]
StartRate = Annotated[float, number("--start-rate", "first request rate offered, requests/s", 0.1)]
MaxRate = Annotated[float, number("--max-rate", "highest request rate offered, requests/s", 1)]
Protocol = Annotated[str, typer.Option("--protocol", help="http or grpc (grpc needs the grpc extra)")]
PerfAnalyzer = Annotated[str, typer.Option(
    "--perf-analyzer", help="Triton's perf_analyzer: a path, or a command on PATH (`make perf-analyzer` "
                            "installs one as .cache/perf_analyzer/run)")]
