"""The serving bundle: the one folder layout that publishing logs, `temper pull` downloads, the
serving runtime loads and the Triton exporter reads. Imports nothing from pipeline/.

    <bundle>/
      model.onnx      the selected candidate
      runtime.json    ServingConfig: tensors, batching limits, padding, the host speed was measured on,
                      the engine and settings it was measured with and the library versions the gates ran on
      report.json     the gate verdicts that let it ship; names the model (`selected`)
      manifest.json   its lineage and sha256: the model is checked against it before it serves
                      (a hand-made bundle without one serves with a warning)
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import onnx
from pydantic import BaseModel, ConfigDict, Field, PositiveInt, model_validator

from temper.artifacts.core.errors import RequestError
from temper.artifacts.core.host import HostProfile
from temper.artifacts.core.layout import Layout, default_axes
from temper.artifacts.engines import Settings
from temper.artifacts.engines.providers import Provider

MODEL = "model.onnx"
CONFIG = "runtime.json"
DTypeName = Literal["float32", "float16", "int64", "int32", "int8", "uint8", "bool"]


class TensorSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    dtype: DTypeName
    shape: list[int]  # -1 = dynamic
    batch_axis: int | None = Field(
        0, ge=0, description="the axis holding a batch's rows (default 0; a rank-0 tensor has none); null: not "
                             "batched, one tensor for every row, equal across the requests of a batch")
    value: int | float | bool | list[Any] | None = Field(
        None, description="a constant input's value (recipe model.inputs[].value): a request may leave the input out")

    @model_validator(mode="after")
    def _axis(self) -> TensorSpec:
        if not self.shape and "batch_axis" not in self.model_fields_set:
            self.batch_axis = None  # a scalar has no batch axis; runtime.json files before batch_axis say nothing
        if self.batch_axis is not None and self.batch_axis >= len(self.shape):
            raise ValueError(f"{self.name}: batch_axis {self.batch_axis} is past the end of shape {self.shape}")
        if self.value is not None and np.shape(self.value) != tuple(self.shape):
            raise ValueError(f"{self.name}: value has shape {list(np.shape(self.value))}, not {self.shape}")
        return self


class ServingConfig(BaseModel):
    """How to serve the bundle's model; written by publishing, read by every server."""

    model_config = ConfigDict(extra="forbid")

    name: str
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    max_batch_size: PositiveInt = 16
    max_delay_ms: float = Field(
        10.0, ge=0, description="wait this long to fill a batch, only while requests keep arriving")
    max_queue: PositiveInt = 256
    timeout_s: float = Field(30.0, gt=0, description="a request not answered by then fails")
    pad: dict[str, int | float] = Field(
        default_factory=dict,
        description="inputs padded along axis 1 to the longest in a batch (token ids, attention mask) "
                    "and the value to pad with",
    )
    measured_on: HostProfile | None = Field(
        None,
        description="the host the bundle's speed gates were measured on; serving warns on a host lacking its features",
    )
    engine: Provider | None = Field(
        None,
        description="the engine the gates selected this model on (report.json selected_engine) and serving runs it "
                    "on: openvino / openvino-bf16 run OpenVINO's CPU plugin; null or an ONNX Runtime row: the best "
                    "ONNX Runtime provider this host really runs (TensorRT, else CUDA, else CPU)",
    )
    session: Settings | None = Field(
        None,
        description="the engine settings the speed gates measured this model with (ONNX Runtime's threads chosen "
                    "there, or OpenVINO's precision, threads, streams and hint, read back); serving runs exactly "
                    "these, choosing threads again only on a host with fewer usable cores. null: nothing was "
                    "measured, serving chooses threads at start",
    )
    batch_dependent: bool = Field(
        False, description="the gates found the model's answer to a row depends on the rows batched with it (dynamic "
                           "INT8's one activation scale per batch: report.json batch_composition.dependent); serving "
                           "then runs each request in a batch of its own, so no request's data moves another's answer")
    gated_with: dict[str, str] = Field(
        default_factory=dict,
        description="library versions the bundle's gates ran on (onnxruntime, or onnxruntime-gpu for the CUDA "
                    "build, onnx, numpy, temper-ml); serving warns when it runs on others",
    )

    def max_rows(self) -> int:
        """The most rows one request may hold: max_batch_size, or less where an input fixes its batch dim."""
        fixed = [s.shape[s.batch_axis] for s in self.inputs if s.batch_axis is not None and s.shape[s.batch_axis] > 0]
        return min([self.max_batch_size, *fixed])

    def check_shape(self, name: str, shape: list[int], max_rows: int | None) -> None:
        """RequestError unless input `name` (known) of `shape` fits the model: its rank, its fixed dims, at most
        `max_rows` rows on its batch axis (None: any). A server asks before it reads a tensor's bytes (from client
        shared memory: a request of a few hundred bytes may name a region of gigabytes)."""
        spec = next(s for s in self.inputs if s.name == name)
        if len(shape) != len(spec.shape):
            raise RequestError(f"input {name!r} has shape {list(shape)}, expected rank {len(spec.shape)} like "
                               f"{spec.shape}")
        for axis, (got, want) in enumerate(zip(shape, spec.shape)):
            if axis != spec.batch_axis and want > 0 and got != want:
                raise RequestError(f"input {name!r} has shape {list(shape)}, expected {spec.shape} (-1 = any)")
        if max_rows is not None and spec.batch_axis is not None and shape[spec.batch_axis] > max_rows:
            raise RequestError(f"{shape[spec.batch_axis]} rows exceed max_batch_size {max_rows}")

    def layout(self) -> Layout:
        """The batch axes and constants of the model's tensors, as the batcher joins and splits requests."""
        return Layout({s.name: s.batch_axis for s in self.inputs}, {s.name: s.batch_axis for s in self.outputs},
                      {s.name: np.asarray(s.value, dtype=s.dtype) for s in self.inputs if s.value is not None})


def example_inputs(config: ServingConfig, rows: int, dynamic: int) -> dict[str, np.ndarray]:
    """Zeros of `rows` rows on each input's batch axis, `dynamic` long on its other dynamic dims, and the
    constant inputs' values: a valid request for warm-ups and examples."""
    def zeros(spec: TensorSpec) -> np.ndarray:
        return np.zeros([rows if axis == spec.batch_axis else d if d > 0 else dynamic
                         for axis, d in enumerate(spec.shape)], dtype=spec.dtype)

    return {s.name: zeros(s) for s in config.inputs} | dict(config.layout().constants)


def tensor_specs(values: list[onnx.ValueInfoProto], axes: dict[str, int | None] | None = None,
                 constants: dict[str, np.ndarray] | None = None) -> list[TensorSpec]:
    """ONNX graph inputs/outputs as TensorSpecs (symbolic or unknown dims become -1), with the batch axes
    `axes` names (default 0, none for a scalar) and the constant inputs' values."""
    specs = []
    for value in values:
        tensor = value.type.tensor_type
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type).name
        shape = [d.dim_value if d.HasField("dim_value") else -1 for d in tensor.shape.dim]
        extra: dict[str, Any] = {}
        if axes is not None and value.name in axes:
            extra["batch_axis"] = axes[value.name]
        if constants and value.name in constants:
            extra["value"] = constants[value.name].tolist()
        specs.append(TensorSpec(name=value.name, dtype=dtype, shape=shape, **extra))
    return specs


def check_describes(config: ServingConfig, model_path: Path) -> None:
    """ValueError unless `config` describes the model: the same inputs, each output it names, their dtypes and
    ranks, and every dim the model fixes (a config may fix a dim the model leaves free, never change a fixed
    one). A runtime.json edited by hand or copied beside another model would otherwise serve until the first
    request, or fail the warm-up as if the host were at fault."""
    model = onnx.load(str(model_path), load_external_data=False)
    initializers = {i.name for i in model.graph.initializer}
    real = {"input": _dtypes_and_shapes(v for v in model.graph.input if v.name not in initializers),
            "output": _dtypes_and_shapes(model.graph.output)}
    declared = {"input": config.inputs, "output": config.outputs}
    names = sorted(s.name for s in config.inputs)
    if names != sorted(real["input"]):
        raise ValueError(f"{CONFIG} declares inputs {names} but {MODEL} takes {sorted(real['input'])}")
    for kind, specs in declared.items():
        for spec in specs:
            if spec.name not in real[kind]:
                raise ValueError(f"{CONFIG} declares output '{spec.name}' but {MODEL} has none of that name "
                                 f"(it has {sorted(real[kind])})")
            dtype, shape = real[kind][spec.name]
            if spec.dtype != dtype:
                raise ValueError(f"{CONFIG} declares {kind} '{spec.name}' as {spec.dtype} but {MODEL} has {dtype}")
            if len(spec.shape) != len(shape) or any(r > 0 and d != r for d, r in zip(spec.shape, shape)):
                raise ValueError(f"{CONFIG} declares {kind} '{spec.name}' with shape {spec.shape} but {MODEL} has "
                                 f"{shape} (-1: any size)")


def _dtypes_and_shapes(values: Iterable[onnx.ValueInfoProto]) -> dict[str, tuple[str, list[int]]]:
    """Each tensor's numpy dtype name and shape (symbolic or unknown dims -1), as runtime.json writes them."""
    found = {}
    for value in values:
        tensor = value.type.tensor_type
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type).name if tensor.elem_type else "untyped"
        found[value.name] = (dtype, [d.dim_value if d.HasField("dim_value") else -1 for d in tensor.shape.dim])
    return found


def config_for(model_path: Path, name: str, layout: Layout | None = None, **serving: object) -> ServingConfig:
    """A ServingConfig describing `model_path`'s real graph inputs and outputs, batched as `layout` says
    (without one: each input's axis named like the first input's batch dim, else 0; each output's 0)."""
    model = onnx.load(str(model_path), load_external_data=False)
    initializers = {i.name for i in model.graph.initializer}
    inputs = [v for v in model.graph.input if v.name not in initializers]
    if layout is None:
        layout = Layout(default_axes({v.name: [d.dim_value or d.dim_param or None for d in v.type.tensor_type.shape.dim]
                                      for v in inputs}))
    return ServingConfig(name=name, inputs=tensor_specs(inputs, dict(layout.inputs), dict(layout.constants)),
                         outputs=tensor_specs(list(model.graph.output), dict(layout.outputs)), **serving)


def write(dest: Path, model_path: Path, config: ServingConfig, extras: Sequence[Path] = ()) -> Path:
    """Assemble a bundle folder (model as model.onnx, its external data, runtime.json, extras)."""
    dest.mkdir(parents=True, exist_ok=True)
    if model_path.name == MODEL:
        for item in model_path.parent.iterdir():  # external data keeps the name the graph refers to
            if item.name == MODEL or item.name.startswith(MODEL + "."):
                shutil.copy2(item, dest / item.name)
    else:  # re-save, so any external data is renamed together with the references to it
        model = onnx.load(str(model_path))
        large = any(t.data_location == onnx.TensorProto.EXTERNAL for t in
                    onnx.load(str(model_path), load_external_data=False).graph.initializer)
        onnx.save_model(model, str(dest / MODEL), save_as_external_data=large,
                        location=MODEL + ".data" if large else None)
    (dest / CONFIG).write_text(config.model_dump_json(indent=2) + "\n")
    for extra in extras:
        shutil.copy2(extra, dest / extra.name)
    return dest


BACKUP = "backup"  # a bundle's burst fallback backup model (artifacts/serving/fallback.py): itself a bundle


def backup_folder(folder: Path) -> Path | None:
    """The bundle's backup model folder, when it carries one."""
    found = folder / BACKUP
    return found if (found / MODEL).is_file() and (found / CONFIG).is_file() else None


def read(folder: Path) -> ServingConfig:
    path = folder / CONFIG
    if not path.is_file() or not (folder / MODEL).is_file():
        raise FileNotFoundError(f"{folder} is not a temper serving bundle (needs {MODEL} and {CONFIG})")
    return ServingConfig.model_validate(json.loads(path.read_text()))
