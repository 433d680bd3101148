"""What `temper bench` does once its flags are parsed: every flag and the model checked before any time goes
into measuring (one line, exit 2, for each problem), then the measurements and their table. Kept apart from
measure.py, which only parses the flags."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from rich.table import Table

from temper.artifacts.core.errors import OptionError, RecipeError, TemperError, first_line
from temper.artifacts.core.host import profile
from temper.artifacts.core.layout import Layout
from temper.artifacts.core.onnx_io import dims, load_structure
from temper.artifacts.engines.providers import PROVIDERS, Provider, provider_named
from temper.pipeline.cli.common import err, out
from temper.validators.throughput import (
    Measurement,
    batch_of,
    fits_in_memory,
    graph_layout,
    measure,
    random_inputs,
    tuned_session,
)


@dataclass(frozen=True)
class Plan:
    """What is measured: the batch sizes, one random sample as large as the largest, its layout."""

    provider: Provider
    sizes: list[int]
    sample: dict[str, np.ndarray]
    layout: Layout


def planned(model: Path, batch_sizes: str, provider: str, dim: list[str], scalar: list[str]) -> Plan:
    """The flags and the model, checked: a RecipeError naming the flag for the first problem."""
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
    for item in dim:
        name, _, value = item.partition("=")
        if not name or not value.isdecimal() or int(value) < 1:  # isdigit() passes '²', which int() refuses
            raise RecipeError(file, "--dim", f"expected NAME=SIZE with SIZE a positive integer, got '{item}'")
        given[name] = int(value)
    texts: dict[str, str] = {}
    for item in scalar:
        name, _, number = item.partition("=")
        try:
            float(number)
        except ValueError:
            raise RecipeError(file, "--value", f"expected INPUT=NUMBER, got '{item}'") from None
        texts[name] = number
    structure, values = _model(model, texts)
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
    return Plan(provider_named(provider), sizes, sample, layout)


def _model(model: Path, texts: dict[str, str]) -> tuple[onnx.ModelProto, dict[str, float]]:
    """The model's structure, and each --value as the scalar input it names holds it exactly."""
    file = str(model)
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
    return structure, values


def measured(model: Path, plan: Plan, duration: float, warmup: float) -> list[Measurement]:
    """Each batch size timed on one session, made as serving makes it (threads chosen by a batch-1 timing)."""
    file, sample, layout, provider = str(model), plan.sample, plan.layout, plan.provider
    results = []
    session = None  # made once: threads chosen as serving chooses them (validators.throughput.tuned_session)
    for size in plan.sizes:
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
    return results


def show(results: list[Measurement], model: Path, provider: str, as_json: bool) -> None:
    """A JSON list on stdout, or a table with the host and the session's settings."""
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
