"""The quantize step: INT8 by one of the backends registered in pipeline/quantize_backends/ (ONNX Runtime's
quantizer, NVIDIA ModelOpt, Intel NNCF), each called through the one `Backend` protocol.

Library failures become one StepFailed line; our own errors (bad data, bad options, a
missing backend) pass through untouched so they keep their exit codes.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

import numpy as np
import onnx

from temper.artifacts.core import onnx_io
from temper.artifacts.core.errors import OptionError, StepFailed, TemperError, first_line
from temper.artifacts.core.layout import AXIS0, Layout
from temper.artifacts.core.onnx_io import Batch
from temper.pipeline.quantize_backends import (
    BACKENDS,
    Job,
    OrtOptions,
    QuantizeCommon,
    QuantizeOptions,
    modelopt,
    ort,
    quantize_static,
)
from temper.pipeline.steps.base import Step, StepContext, require_known
from temper.pipeline.steps.quantize import census_check, fallback


def _searchable() -> tuple[str, ...]:
    """Every backend's searchable options (each key once, in the registry's order)."""
    return tuple(dict.fromkeys(key for backend in BACKENDS.values() for key in backend.options.searchable))


def preflight(options: QuantizeCommon, layout: Layout) -> None:
    """What a quantize step needs of this host and of the recipe's inputs, known before anything is built
    (`temper check`, `temper run`'s pre-flight): EnvironmentProblem for a backend that is not installed,
    OptionError("backend") for ModelOpt on inputs it cannot calibrate."""
    BACKENDS[options.backend].require()
    problem = modelopt.layout_problem(layout) if options.backend == modelopt.MODELOPT.name else None
    if problem:
        raise OptionError("backend", problem)


class Quantize(Step[QuantizeCommon]):
    """INT8 quantization; static modes calibrate on the recipe's calibration set."""

    name: ClassVar[str] = "quantize"
    options_model = QuantizeOptions
    searchable = _searchable()
    budget_option = "fallback"

    def uses_calibration(self, options: QuantizeCommon) -> bool:
        return options.mode == "static"

    def uses_evaluation(self, options: QuantizeCommon) -> bool:
        return getattr(options, "fallback", None) is not None

    def precision(self, options: QuantizeCommon) -> str:
        return f"int8-{options.mode}"

    def validate(self, model: onnx.ModelProto, options: QuantizeCommon) -> None:
        nodes = [node.name for node in model.graph.node if node.name]
        require_known("exclude_nodes", "node", options.exclude_nodes, nodes)
        op_types = sorted({node.op_type for node in model.graph.node})
        require_known("exclude_op_types", "op type", options.exclude_op_types, op_types)
        BACKENDS[options.backend].validate(options)

    def run(self, src: Path, dst: Path, options: QuantizeCommon, ctx: StepContext) -> None:
        backend = BACKENDS[options.backend]
        backend.require()  # before loading data: a missing backend should fail fast
        census_check.require_quantizable(src, backend.label)  # as `temper check` forecasts, before any library
        structure = onnx_io.load_structure(src)
        job = Job(src, dst, structure, needs_external_data(structure), ctx.scratch, ctx.layout,
                  lambda layout: calibration_feeds(structure, ctx.calibration(), layout),
                  _nodes_of_types(structure, options.exclude_op_types), ctx.ranges)
        if isinstance(options, OrtOptions) and options.fallback is not None:
            _library(backend.stage(options), lambda: _tune(job, options, ctx))
        else:
            _library(backend.stage(options), lambda: backend.quantize(job, options))
        census_check.require_quantized(dst, backend.label)
        _check_runs(dst, ctx.sample(), ctx.layout)


def _tune(job: Job, options: OrtOptions, ctx: StepContext) -> None:
    """ONNX Runtime's static INT8 tuned by the fallback's trials (pipeline/steps/quantize/fallback.py)."""
    feeds = job.feeds(job.layout)
    prepared, keep_float = ort.prepare(job, options, feeds)

    def configured(chosen: OrtOptions) -> tuple[quantize_static.Prepared, list[str]]:
        """Another configuration's calibration, in a folder of its own (the first one's files stay)."""
        return ort.prepare(job, chosen, feeds, f"config-{chosen.per_channel}-{chosen.calibration}")

    fallback.tune(prepared, job.dst, options, keep_float, feeds, ctx.scorer(), ctx.scratch, ctx.progress,
                  configured, ctx.layout, ctx.log)


def rankable(options: object) -> bool:
    """The SQNR ranking (`temper sensitivity`, the fallback) measures ONNX Runtime's static INT8."""
    return isinstance(options, OrtOptions) and options.mode == "static"


def calibration_feeds(model: onnx.ModelProto, batches: list[Batch], layout: Layout = AXIS0) -> list[Batch]:
    """The calibration batches (in the model's layout: rows on each input's batch axis) as feeds for `model`.

    A batch larger than a fixed batch dim is cut into full-size chunks so every sample
    counts (fit_batch alone would keep only its first rows).
    """
    size = onnx_io.fixed_batch(model, layout)
    feeds: list[Batch] = []
    for batch in batches:
        rows = layout.rows(batch)
        if size and rows > size:
            starts = range(0, rows - size + 1, size)
            feeds += [onnx_io.fit_batch(model, layout.take(batch, s, s + size), layout) for s in starts]
        else:
            feeds.append(onnx_io.fit_batch(model, batch, layout))
    if not feeds:
        raise StepFailed("quantize: the calibration set has no batches")
    return feeds


def _nodes_of_types(model: onnx.ModelProto, op_types: list[str]) -> list[str]:
    """Names of the nodes of the excluded op types.

    The libraries rewrite ops before they match op types (dynamic: Gemm -> MatMul + Add;
    quant_pre_process: MatMul + Add -> Gemm), so an op-type exclusion only holds when it
    is passed as node names too.
    """
    wanted = set(op_types)
    return [node.name for node in model.graph.node if node.op_type in wanted and node.name]


def needs_external_data(model: onnx.ModelProto) -> bool:
    """Past protobuf's 2 GB limit the libraries must write weights as external data too."""
    external = any(init.data_location == onnx.TensorProto.EXTERNAL for init in model.graph.initializer)
    return external or model.ByteSize() > 1_800_000_000


def _library(what: str, work: Callable[[], None]) -> None:
    """Run library code with its progress prints off stdout and its failures as one line."""
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            work()
    except (TemperError, OptionError):
        raise
    except Exception as err:
        raise StepFailed(f"quantize: {what} failed: {first_line(err)}") from err


def _check_runs(path: Path, sample: Batch, layout: Layout) -> None:
    """The quantized model must load in ONNX Runtime and give finite outputs on a real batch."""
    try:
        sess = onnx_io.session(path)
    except Exception as err:
        raise StepFailed(f"quantize: the quantized model does not load in ONNX Runtime: {first_line(err)}") from err
    feed = onnx_io.fit_batch(onnx_io.load_structure(path), sample, layout)
    try:
        outputs = sess.run(None, feed)
    except Exception as err:
        raise StepFailed(f"quantize: the quantized model does not run in ONNX Runtime: {first_line(err)}") from err
    for meta, value in zip(sess.get_outputs(), outputs, strict=True):
        if np.issubdtype(value.dtype, np.floating) and not np.isfinite(value).all():
            raise StepFailed(f"quantize: output '{meta.name}' of the quantized model has NaN/Inf on a sample batch")
