"""What TensorRT really built: the layer precisions of the engine its provider compiled, read back.

TensorRT 11 has no precision flags: a build's precision comes from the graph alone (FP16 casts, Q/DQ),
and projects have shipped engines labelled FP16 that ran FP32 without an error (roboflow/rf-detr#1453).
So a tensorrt pair's engine is read back through TensorRT's engine inspector
(IEngineInspector.get_engine_information(LayerInformationFormat.JSON)), each layer counted by the data
type of what it writes, and gated like the graph's census: an FP16 candidate with no layer writing FP16,
or an INT8 one with none writing INT8, fails with one line.

The inspector's JSON holds {"Layers": [...], "Bindings": [...]}; each layer is an object with "Name",
"LayerType" and "Outputs" (each with "Format/Datatype", e.g. "Channel major FP16 format where channel % 8
== 0") when the engine was built with detailed profiling verbosity, else only its name (then nothing is
gated: the census says it could not tell).
"""

from __future__ import annotations

import importlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from temper.validators.gates import Gate

# the inspector's data type words, by the precision they are
_TYPES = {"fp32": "fp32", "float": "fp32", "tf32": "fp32", "fp16": "fp16", "half": "fp16", "bf16": "bf16",
          "int8": "int8", "fp8": "fp8", "int4": "int4", "fp4": "fp4", "int32": "other", "int64": "other",
          "bool": "other", "uint8": "other"}
_WORD = re.compile(r"\b(" + "|".join(_TYPES) + r")\b", re.IGNORECASE)
# layers that only move or convert data: they write whatever the layer before them computed in
_MOVING = ("Reformat", "Shuffle", "NoOp", "Constant", "Identity", "Slice", "Concatenation", "Gather")


@dataclass
class EngineCensus:
    """TensorRT layers by the precision they write (data-moving layers left out)."""

    layers: int = 0
    by_precision: dict[str, int] = field(default_factory=dict)
    detailed: bool = True  # False: the engine gave names only, so no precision is known

    def count(self, precision: str) -> int:
        return self.by_precision.get(precision, 0)

    def describe(self) -> str:
        if not self.detailed:
            return f"{self.layers} layers, names only (the engine was not built with detailed profiling verbosity)"
        parts = ", ".join(f"{n} {p}" for p, n in sorted(self.by_precision.items()))
        return f"{self.layers} compute layers: {parts or 'none'}"


def from_inspector(text: str) -> EngineCensus:
    """The census of the inspector's JSON."""
    layers = json.loads(text).get("Layers", [])
    census = EngineCensus()
    for layer in layers:
        if isinstance(layer, str):  # ProfilingVerbosity kLAYER_NAMES_ONLY
            census.layers += 1
            census.detailed = False
            continue
        if any(word in str(layer.get("LayerType", "")) for word in _MOVING):
            continue
        census.layers += 1
        written = " ".join(str(o.get("Format/Datatype", "")) for o in layer.get("Outputs", []))
        found = _WORD.search(written)
        precision = _TYPES[found.group(1).lower()] if found else "other"
        census.by_precision[precision] = census.count(precision) + 1
    return census


def gate(census: EngineCensus, precision: str) -> Gate | None:
    """The engine-precision gate of a tensorrt pair whose graph says `precision` (fp16, int8-*): it fails
    when no compute layer of the engine writes that precision. None for an FP32 graph, or no detail."""
    wanted = "int8" if precision.startswith("int8") else precision
    if wanted not in ("fp16", "int8") or not census.detailed:
        return None
    got = census.count(wanted)
    detail = (f"TensorRT built {got} of {census.layers} compute layers in {wanted.upper()} "
              f"({census.describe()})")
    if not got:
        detail += f": the engine of this {wanted.upper()} candidate runs {_widest(census)}"
    return Gate("engine_precision.tensorrt", got > 0, float(got), None, detail, kind="precision",
                provider="tensorrt")


def _widest(census: EngineCensus) -> str:
    ranked = sorted(census.by_precision.items(), key=lambda item: -item[1])
    return ranked[0][0].upper() if ranked else "no compute layer"


def read_engine(engine_file: Path) -> EngineCensus | None:
    """The census of a serialized engine (ONNX Runtime's TensorRT engine cache holds one per subgraph),
    through TensorRT's own inspector; None when TensorRT cannot be imported or cannot read it."""
    try:
        trt = importlib.import_module("tensorrt")
    except ImportError:
        return None
    runtime = trt.Runtime(trt.Logger(trt.Logger.ERROR))
    engine = runtime.deserialize_cuda_engine(engine_file.read_bytes())
    if engine is None:
        return None
    inspector = engine.create_engine_inspector()
    return from_inspector(inspector.get_engine_information(trt.LayerInformationFormat.JSON))


def of_model(model: Path) -> EngineCensus | None:
    """The census of the engines ONNX Runtime's TensorRT provider built for `model` (found in its engine cache
    by the model's prefix), summed over its subgraphs; None when there are none, or TensorRT cannot read them."""
    from temper.artifacts.engines.onnxruntime import engine_prefix, tensorrt_cache

    total: EngineCensus | None = None
    for engine_file in sorted(tensorrt_cache().glob(f"{engine_prefix(model)}*.engine")):
        census = read_engine(engine_file)
        if census is None:
            return None
        if total is None:
            total = census
            continue
        total.layers += census.layers
        total.detailed = total.detailed and census.detailed
        for precision, count in census.by_precision.items():
            total.by_precision[precision] = total.count(precision) + count
    return total


def gates(model: Path, precision: str) -> list[Gate]:
    """The engine-precision gate of a tensorrt pair, from the engines its provider built for `model`; none when
    they cannot be read (no TensorRT Python module) or hold no layer detail."""
    census = of_model(model)
    found = gate(census, precision) if census is not None else None
    return [found] if found is not None else []
