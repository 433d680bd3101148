"""The quantize step: INT8 with ONNX Runtime (dynamic or static), NVIDIA ModelOpt or Intel NNCF (static).

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

from temper.artifacts import onnx_io
from temper.artifacts.errors import OptionError, StepFailed, TemperError, first_line
from temper.artifacts.layout import AXIS0, Layout
from temper.artifacts.onnx_io import Batch
from temper.pipeline.step_options import NNCF_ONLY, NNCF_PRESETS, QuantizeOptions
from temper.pipeline.steps.base import Step, StepContext, require_known
from temper.pipeline.steps.quantize import (
    census_check,
    fallback,
    preprocess,
    quantize_dynamic,
    quantize_modelopt,
    quantize_nncf,
    quantize_static,
)

BACKENDS = {"ort": "ONNX Runtime's quantizer", "modelopt": "ModelOpt", "nncf": "NNCF"}


def preflight(options: QuantizeOptions, layout: Layout) -> None:
    """What a quantize step needs of this host and of the recipe's inputs, known before anything is built
    (`temper check`, `temper run`'s pre-flight): EnvironmentProblem for a backend that is not installed,
    OptionError("backend") for ModelOpt on inputs it cannot calibrate."""
    if options.backend == "modelopt":
        quantize_modelopt.require()
        problem = quantize_modelopt.layout_problem(layout)
        if problem:
            raise OptionError("backend", problem)
    elif options.backend == "nncf":
        quantize_nncf.require()


class Quantize(Step[QuantizeOptions]):
    """INT8 quantization; static modes calibrate on the recipe's calibration set."""

    name: ClassVar[str] = "quantize"
    options_model = QuantizeOptions
    searchable = ("preset", "format", "per_channel", "reduce_range", "calibration", "activation_type", "weight_type",
                  "symmetric_activations", "symmetric_weights", *NNCF_ONLY)
    budget_option = "fallback"

    def uses_calibration(self, options: QuantizeOptions) -> bool:
        return options.mode == "static"

    def precision(self, options: QuantizeOptions) -> str:
        return f"int8-{options.mode}"

    def validate(self, model: onnx.ModelProto, options: QuantizeOptions) -> None:
        nodes = [node.name for node in model.graph.node if node.name]
        require_known("exclude_nodes", "node", options.exclude_nodes, nodes)
        op_types = sorted({node.op_type for node in model.graph.node})
        require_known("exclude_op_types", "op type", options.exclude_op_types, op_types)
        if options.backend == "nncf":
            quantize_nncf.validate(options)
            return
        misplaced = [key for key in NNCF_ONLY if getattr(options, key) is not None]
        if misplaced:
            raise OptionError(misplaced[0], "an option of NNCF's quantizer: it needs backend: nncf")
        if options.preset in NNCF_PRESETS:
            raise OptionError("preset", f"{options.preset} is NNCF's preset: it needs backend: nncf")
        if options.backend == "modelopt":
            quantize_modelopt.validate(options)
        elif options.mode == "static":
            quantize_static.validate(options)

    def run(self, src: Path, dst: Path, options: QuantizeOptions, ctx: StepContext) -> None:
        structure = onnx_io.load_structure(src)
        large = needs_external_data(structure)
        typed = _nodes_of_types(structure, options.exclude_op_types)
        if options.mode == "dynamic":
            _library("ONNX Runtime dynamic quantization",
                     lambda: quantize_dynamic.quantize(src, dst, options, typed, ctx.scratch, large))
        elif options.backend == "ort":
            feeds = calibration_feeds(structure, ctx.calibration(), ctx.layout)

            def prepare(chosen: QuantizeOptions, scratch: Path = ctx.scratch) -> tuple[quantize_static.Prepared,
                                                                                      list[str]]:
                scratch.mkdir(exist_ok=True)
                prepared = quantize_static.prepare(src, chosen, feeds, scratch, large, ctx.ranges)
                return prepared, preprocess.follow_fusions(prepared.structure, chosen.exclude_nodes, typed)

            def configured(chosen: QuantizeOptions) -> tuple[quantize_static.Prepared, list[str]]:
                """Another configuration's calibration, in a folder of its own (the first one's files stay)."""
                return prepare(chosen, ctx.scratch / f"config-{chosen.per_channel}-{chosen.calibration}")

            def static() -> None:
                prepared, keep_float = prepare(options)
                if options.fallback is None:
                    quantize_static.write(prepared, dst, options, keep_float)
                else:
                    fallback.tune(prepared, dst, options, keep_float, feeds, ctx.scorer(), ctx.scratch, ctx.progress,
                                  configured, ctx.layout)

            _library("ONNX Runtime static quantization", static)
        elif options.backend == "modelopt":
            quantize_modelopt.require()  # before loading data: a missing backend should fail fast
            feeds = calibration_feeds(structure, ctx.calibration(), ctx.layout)
            _library(
                "ModelOpt quantization",
                lambda: quantize_modelopt.quantize(src, dst, options, feeds, ctx.scratch, large, ctx.layout),
            )
        else:
            quantize_nncf.require()
            feeds = calibration_feeds(structure, ctx.calibration())
            _library("NNCF quantization", lambda: quantize_nncf.quantize(src, dst, options, feeds, large))
        census_check.require_quantized(dst, BACKENDS[options.backend])
        _check_runs(dst, ctx.sample(), ctx.layout)


def rankable(options: QuantizeOptions) -> bool:
    """The SQNR ranking (`temper sensitivity`, the fallback) measures ONNX Runtime's static INT8."""
    return options.mode == "static" and options.backend == "ort"


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
