"""The `export` step: torch module -> ONNX, checked against torch on a real batch before it is trusted."""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from pathlib import Path

import numpy as np
import onnx
import torch

from temper.artifacts.core import onnx_io
from temper.artifacts.core.errors import OptionError, StepFailed, first_line
from temper.artifacts.core.onnx_io import Batch
from temper.pipeline.input_layout import layout_of
from temper.pipeline.quantize_backends.base import quiet_logger
from temper.pipeline.recipe import ModelSpec
from temper.validators.fidelity import compare


def dynamic_axes(spec: ModelSpec) -> dict[str, dict[int, str]]:
    """Symbolic dims of the recipe's inputs; outputs share the first input's leading (batch) dim when every
    input holds its samples on axis 0 (otherwise no output axis is assumed: check finds them)."""
    axes = {i.name: {a: d for a, d in enumerate(i.shape) if isinstance(d, str)} for i in spec.inputs}
    batched = [i for i in spec.inputs if i.batch_axis is not None]  # the recipe has one
    if isinstance(lead := batched[0].shape[0], str) and all(i.batch_axis == 0 for i in batched):
        axes.update({name: {0: lead} for name in spec.outputs})
    return {k: v for k, v in axes.items() if v}


def export(module: torch.nn.Module, spec: ModelSpec, sample: Batch, dst: Path, scratch: Path) -> None:
    """Export `module`, then compare ONNX Runtime with torch on `sample`; a mismatch is a StepFailed."""
    module.eval()
    feed = {i.name: sample[i.name] for i in spec.inputs}
    args = tuple(torch.from_numpy(np.require(feed[i.name], requirements="C")) for i in spec.inputs)  # 0-d stays 0-d
    raw = scratch / "exported.onnx"
    opts = spec.export
    logs = io.StringIO()
    try:  # the module itself first: if it cannot take the declared inputs, no exporter setting will help
        with torch.no_grad():
            module(*args)
    except Exception as exc:
        shown = ", ".join(f"{i.name} {i.dtype} {list(feed[i.name].shape)}" for i in spec.inputs)
        raise OptionError("inputs", f"the model does not run on a batch of the declared inputs ({shown}): "
                                    f"{first_line(exc)}; declare the dtypes and shapes its forward() takes") from exc
    try:
        with (torch.no_grad(), warnings.catch_warnings(), contextlib.redirect_stdout(logs),
              quiet_logger(logging.getLogger("torch"))):
            warnings.simplefilter("ignore")
            torch.onnx.export(
                module, args, str(raw),
                input_names=[i.name for i in spec.inputs], output_names=list(spec.outputs),
                dynamic_axes=dynamic_axes(spec) or None, opset_version=opts.opset, dynamo=opts.dynamo,
            )
            expected = module(*args)
    except Exception as exc:
        raise StepFailed(f"export: torch.onnx.export failed ({'dynamo' if opts.dynamo else 'torchscript'} exporter): "
                         f"{first_line(exc)} "
                         f"(try model.export.dynamo: {str(not opts.dynamo).lower()})") from exc
    exported = onnx.load(str(raw))
    try:
        onnx.checker.check_model(exported, full_check=True)
    except Exception as exc:  # e.g. the dynamo exporter defining an output name twice (pytorch#158094)
        raise StepFailed(f"export: the exported graph is invalid: {first_line(exc)} "
                         f"(try model.export.dynamo: {str(not opts.dynamo).lower()})") from exc
    onnx_io.save(exported, dst)  # inline the weights the dynamo exporter writes beside the file
    expected_list = [expected] if isinstance(expected, torch.Tensor) else list(expected)
    if len(expected_list) != len(spec.outputs):
        raise StepFailed(f"export: the module returns {len(expected_list)} outputs "
                         f"but model.outputs names {len(spec.outputs)}")
    got = onnx_io.run(dst, feed, layout_of(spec.inputs))
    for name, ref, out in zip(spec.outputs, expected_list, got):
        result = compare(name, ref.detach().numpy(), out, atol=opts.atol, rtol=opts.rtol)
        if not result.within_tolerance:
            raise StepFailed(f"export: ONNX output differs from torch beyond atol={opts.atol}, rtol={opts.rtol}: "
                             f"{result.describe()}")

