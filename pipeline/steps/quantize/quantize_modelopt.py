"""Static INT8 with NVIDIA ModelOpt's ONNX PTQ: QDQ placed by TensorRT's rules, calibrated on CPU.

ModelOpt is an optional extra, imported only when a recipe asks for it.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import ModuleType

import numpy as np
import onnx

from pipeline import onnx_io
from pipeline.errors import EnvironmentProblem, OptionError
from pipeline.onnx_io import Batch
from pipeline.step_options import QuantizeOptions

METHODS = {"minmax": "max", "entropy": "entropy"}


def require() -> ModuleType:
    try:
        import modelopt.onnx.quantization as moq
    except ImportError as err:
        cause = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise EnvironmentProblem(
            f"quantize backend 'modelopt' needs NVIDIA ModelOpt: pip install 'temper-ml[modelopt]' ({cause})"
        ) from err
    return moq


def validate(options: QuantizeOptions) -> None:
    """ModelOpt's INT8 recipe is fixed (signed int8, weights per channel): refuse options it would ignore."""
    if options.calibration not in METHODS:
        methods = " or ".join(METHODS)
        raise OptionError(
            "calibration", f"backend: modelopt calibrates with {methods}; use backend: ort for {options.calibration}"
        )
    for key in ("activation_type", "weight_type"):
        if getattr(options, key) != "int8":
            raise OptionError(key, "backend: modelopt quantizes to int8 only")
    if options.reduce_range:
        raise OptionError("reduce_range", "backend: modelopt has no reduced-range mode")
    if "per_channel" in options.model_fields_set and not options.per_channel:
        raise OptionError("per_channel", "backend: modelopt always quantizes weights per channel")
    ignored = sorted({"num_bins", "percentile"} & options.model_fields_set)
    if ignored:
        raise OptionError(ignored[0], "backend: modelopt chooses its own histogram; remove this option")


def quantize(src: Path, dst: Path, options: QuantizeOptions, feeds: list[Batch], scratch: Path, large: bool) -> None:
    moq = require()
    local = scratch / "modelopt_input.onnx"  # ModelOpt writes its intermediate files beside its input
    onnx_io.save(onnx.load(str(src)), local)
    stacked = {name: np.concatenate([feed[name] for feed in feeds]) for name in feeds[0]}
    # One calibration step per feed; without shapes ModelOpt would step one sample at a time on dynamic dims.
    shapes = ",".join(f"{name}:{'x'.join(map(str, array.shape))}" for name, array in feeds[0].items())
    moq.quantize(
        str(local),
        quantize_mode="int8",
        calibration_data=stacked,
        calibration_method=METHODS[options.calibration],
        calibration_shapes=shapes,
        calibration_eps=["cpu"],
        op_types_to_exclude=options.exclude_op_types or None,
        nodes_to_exclude=[re.escape(name) + "$" for name in options.exclude_nodes] or None,  # ModelOpt takes regexes
        use_external_data_format=large,
        output_path=str(dst),
        high_precision_dtype="fp32",  # FP16 is the fp16 step's job, not a side effect of this one
        log_level="WARNING",
    )
