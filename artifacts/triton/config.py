"""Export a serving bundle as a Triton model repository, so the same artifacts scale out on
Triton / KServe clusters. Imports nothing from pipeline/ and needs no Triton package: the
config.pbtxt is written by the small text-format writer below (the tests parse it with
Triton's own ModelConfig protobuf).

    <dest>/<name>/
      config.pbtxt
      1/model.onnx     (+ the external-data files it references), or 1/model.plan
      1/runtime.json   (+ manifest.json, report.json when the bundle has them): the version folder is a
                       temper bundle too, so `temper serve <dest>` serves the repository (formats/repository.py);
                       a plan-only folder (no model.onnx) is Triton's alone
      .temper-output   the marker that lets a later export replace this folder
    --version N writes N/ instead of 1/, beside the versions already there.

Batching follows the bundle's tensors. When every input and output has a dynamic first
(batch) dim, Triton batches: `max_batch_size` comes from runtime.json, dims leave the batch
dim out, and the dynamic batcher gets the bundle's delay, queue bound and timeout. When any
tensor has a fixed first dim (say an export traced at batch 1), the model cannot take a
batch: Triton's `max_batch_size: 0` means exactly that, dims then spell the full shape,
batch dim included, and there is no dynamic batcher (Triton has nothing to batch), so
runtime.json's batching, queue and timeout settings do not apply. The same holds when a tensor
holds its rows on another axis than 0 (runtime.json `batch_axis`: Silero VAD's state [2, batch,
128]) or an input is not batched at all (a constant such as a sample rate): Triton batches on
axis 0 only, so such a model is exported with `max_batch_size: 0` (`no_batching` says why, and
`temper export-triton` prints it), clients send every input, constants included, and a model
with constant inputs gets no warm-up (zeros are not the constant's value).

The session settings the speed gates measured with (runtime.json `session`) become the backend's
`intra_op_thread_count`, `execution_mode` and `optimization.graph.level`; intra-op spinning has no
backend setting, so Triton's sessions spin as ONNX Runtime does by default.

What serves differently on Triton than on `temper serve` (`differences` says it for a given model):
Triton waits up to `max_queue_delay_microseconds` for a full batch even when nothing else is queued
(delay is pure latency at concurrency 1; set `max_delay_ms: 0` where that matters), its queue
timeout covers time spent queued, not execution, and it has no padding: runtime.json's `pad` is
not carried over, and Triton batches only requests of one shape.

A bundle with a capacity.json (`temper capacity`) is exported with the batching and instance count it chose
(`plan`), and KIND_AUTO resolves from the engine row the bundle was gated on (KIND_CPU for a CPU row), so the
cluster's pods ask for a GPU only where the model was gated on one.

`triton_cluster` writes the Kubernetes and KServe resources that run such a repository (`triton_alerts` the alert
rules and the autoscaler, from the capacity measured).
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from temper.artifacts import engines
from temper.artifacts.core.folders import MARKER, is_marked, mark, replaceable
from temper.artifacts.engines.providers import PROVIDERS, Provider
from temper.artifacts.formats.bundle import BACKUP, MODEL, ServingConfig, TensorSpec, backup_folder, read, write
from temper.artifacts.formats.bundle import CONFIG as BUNDLE_CONFIG
from temper.artifacts.formats.capacity import CAPACITY, Capacity
from temper.artifacts.formats.capacity import PLOT as CAPACITY_PLOT
from temper.artifacts.formats.capacity import read as read_capacity
from temper.artifacts.formats.integrity import MANIFEST, REPORT

CONFIG = "config.pbtxt"
VERSION = "1"
VERSION_NAME = re.compile(r"[1-9][0-9]*")  # a version folder Triton serves: a number without a leading 0
BUNDLE_FILES = (BUNDLE_CONFIG, MANIFEST, REPORT, CAPACITY, CAPACITY_PLOT)  # a temper bundle beside the model
PLAN = "model.plan"  # a TensorRT engine beside model.onnx; served instead of it when present
WARMUP_DIM = 8  # concrete size for dynamic non-batch dims (e.g. sequence length) in warm-up requests
KINDS = ("KIND_AUTO", "KIND_GPU", "KIND_CPU")
MODEL_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*")  # a plain folder name Triton accepts; never `.git`, `..`
DATA_TYPES = {
    "float32": "TYPE_FP32",
    "float16": "TYPE_FP16",
    "int64": "TYPE_INT64",
    "int32": "TYPE_INT32",
    "int8": "TYPE_INT8",
    "uint8": "TYPE_UINT8",
    "bool": "TYPE_BOOL",
}


class _Map(dict):
    """A protobuf map field: a JSON object in the JSON form (what json_format.ParseDict and Triton's /config
    use), a repeated key/value message in the text form."""


class _Enum(str):
    """A text-format enum value: written bare, not quoted."""


@dataclass(frozen=True)
class Plan:
    """What an export serves with: the config with capacity.json's batching when the bundle has one, the instance
    count (asked, else capacity.json's, at least 1, else 1), the instance kind (KIND_AUTO resolved from the engine
    row the bundle was gated on: KIND_GPU for a GPU row, KIND_CPU for a CPU one; kept for a bundle that names no
    engine) and the capacity measured, if any."""

    config: ServingConfig
    instances: int
    kind: str
    capacity: Capacity | None

    @property
    def gpu(self) -> bool:
        return self.kind != "KIND_CPU"


def plan(bundle: Path, config: ServingConfig, instances: int | None, kind: str) -> Plan:
    if kind not in KINDS:
        raise ValueError(f"instance kind {kind!r} is not one of {', '.join(KINDS)}")
    if instances is not None and instances < 1:
        raise ValueError(f"instances must be >= 1, got {instances}")
    measured = read_capacity(bundle)
    if measured is not None:
        config = measured.serving(config)
        instances = max(1, measured.chosen.instances) if instances is None else instances
    row: Provider = config.engine or "cpu"
    if (bundle / PLAN).is_file():
        if kind == "KIND_CPU":
            raise ValueError(f"{bundle} holds a TensorRT plan, which only runs on a GPU; use KIND_GPU or KIND_AUTO")
    else:
        try:
            kind = engines.of(row).triton_kind(row, kind)
        except ValueError as err:
            raise ValueError(f"{bundle} was {err}") from err
        if kind == "KIND_AUTO" and config.engine is not None:  # gated on a CPU: no GPU to ask for
            kind = "KIND_GPU" if PROVIDERS[row].gpu else "KIND_CPU"
    return Plan(config, instances or 1, kind, measured)


def export_repository(bundle: Path, dest: Path, instances: int | None = None, kind: str = "KIND_AUTO",
                      config: ServingConfig | None = None, version: str = VERSION,
                      evidence: Path | None = None, backup: tuple[Path, ServingConfig] | None = None) -> Path:
    """Write a Triton model repository: dest/<config.name>/config.pbtxt and dest/<name>/<version>/ holding
    model.onnx (plus external data if any) and the bundle's own files, runtime.json, manifest.json and
    report.json, so that each version folder is a temper bundle `temper serve` serves too (Triton's
    ONNX Runtime backend reads model.onnx and ignores the rest). Returns the model folder.

    The model folder is replaced only when temper wrote it (its marker), since the name comes from the bundle,
    not from the user; its other version folders stay, and config.pbtxt is rewritten unless a higher version
    is there (Triton has one config per model and serves the highest version).

    `bundle` is a serving bundle (its runtime.json is the config), or, with `config`, any folder
    holding model.onnx: a model of a run's output folder, with the options publishing would give it; then
    `evidence`, that run's output folder when the model is the one its report.json selected, lends the
    version folder its manifest.json and report.json, so that serving the repository checks the model's sha256
    as serving a published bundle does (another candidate has no report naming it, and stays unchecked).

    The burst fallback's backup model goes into the version folder's backup/ (Triton ignores it; `temper serve
    REPO --burst-fallback-ms` serves it): a bundle's own backup/, or `backup`, a run's backup pair (its model
    folder and the serving config publishing would give it)."""
    given = config
    chosen = plan(bundle, config or read(bundle), instances, kind)
    config, instances, kind = chosen.config, chosen.instances, chosen.kind
    if not VERSION_NAME.fullmatch(version):
        raise ValueError(f"version {version!r} is not a Triton version folder name (1, 2, ...: no leading 0)")
    name = folder_name(config.name)
    folder = dest / name
    if not replaceable(folder):
        raise FileExistsError(f"{folder} exists and temper did not write it (no {MARKER} marker): "
                              "delete it or choose another --dest")
    engine_plan = (bundle / PLAN).is_file()
    files = [bundle / PLAN] if engine_plan else [bundle / MODEL, *_external_data(bundle)]
    files += [bundle / f for f in BUNDLE_FILES if (bundle / f).is_file() and (given is None or f != BUNDLE_CONFIG)]
    vouching = [evidence / f for f in (MANIFEST, REPORT)] if evidence is not None else []
    row: Provider = config.engine or "cpu"
    if engine_plan:
        text = _pbtxt(_model_config(config, instances, kind, {"platform": "tensorrt_plan"}))
    else:
        text = _pbtxt(_model_config(config, instances, kind, engines.of(row).triton(row, config.session)))

    dest.mkdir(parents=True, exist_ok=True)
    staging = dest / f".{name}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        (staging / version).mkdir(parents=True)
        for file in files:
            target = staging / version / file.relative_to(bundle)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(file, target)
        for file in vouching:
            shutil.copy2(file, staging / version / file.name)
        if backup is not None:
            write(staging / version / BACKUP, backup[0] / MODEL, backup[1])
        elif (own := backup_folder(bundle)) is not None:
            shutil.copytree(own, staging / version / BACKUP)
        if given is not None:  # a run's model: runtime.json is the config publishing would give it
            (staging / version / BUNDLE_CONFIG).write_text(given.model_dump_json(indent=2) + "\n")
        (staging / CONFIG).write_text(text)
        mark(staging, model=name)
        if folder.is_dir() and is_marked(folder):
            _add_version(staging, folder, version)
        else:
            shutil.rmtree(folder, ignore_errors=True)
            staging.rename(folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder


def _add_version(staging: Path, folder: Path, version: str) -> None:
    """Put staging/<version> into an existing model folder in place of that version, keeping the others;
    config.pbtxt follows the highest version."""
    old = folder / f".{version}.old"
    shutil.rmtree(old, ignore_errors=True)
    if (folder / version).exists():
        os.replace(folder / version, old)
    os.replace(staging / version, folder / version)
    shutil.rmtree(old, ignore_errors=True)
    others = [int(p.name) for p in folder.iterdir() if p.is_dir() and VERSION_NAME.fullmatch(p.name)]
    if int(version) >= max(others):
        os.replace(staging / CONFIG, folder / CONFIG)


def folder_name(name: str) -> str:
    """`name` when it can be a Triton model folder (and the cluster manifests' folder); ValueError otherwise."""
    if not MODEL_NAME.fullmatch(name):
        raise ValueError(f"model name {name!r} in {BUNDLE_CONFIG} cannot be a Triton model folder name: "
                         "use letters, digits, _, - and ., not starting with .")
    return name


def _external_data(bundle: Path) -> list[Path]:
    """The files model.onnx keeps its weights in (ONNX resolves them relative to the model)."""
    model = onnx.load(str(bundle / MODEL), load_external_data=False)
    locations = {
        entry.value
        for tensor in _tensors(model.graph)
        if tensor.data_location == onnx.TensorProto.EXTERNAL
        for entry in tensor.external_data
        if entry.key == "location"
    }
    paths = []
    for location in sorted(locations):
        path = bundle / location
        if not path.resolve().is_relative_to(bundle.resolve()) or not path.is_file():
            raise FileNotFoundError(f"{bundle / MODEL} keeps weights in {location!r}, not a file in the bundle")
        paths.append(path)
    return paths


def _tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """Every tensor a graph stores: initializers and attribute tensors, subgraphs included."""
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            yield from ([attr.t] if attr.HasField("t") else attr.tensors)
            for sub in [attr.g] if attr.HasField("g") else attr.graphs:
                yield from _tensors(sub)


def no_batching(config: ServingConfig) -> str | None:
    """Why Triton cannot batch the bundle's model (one line), or None when it can."""
    tensors = [*config.inputs, *config.outputs]
    moved = [f"{s.name} holds its rows on axis {s.batch_axis}" for s in tensors if s.batch_axis not in (0, None)]
    constant = [s.name if s.value is None else f"{s.name} ({s.value})" for s in config.inputs if s.batch_axis is None]
    fixed = [s.name for s in tensors if s.batch_axis == 0 and s.shape[0] != -1]
    reasons = moved + ([f"{', '.join(constant)} {'is' if len(constant) == 1 else 'are'} not batched"] if constant
                       else []) + ([f"{', '.join(fixed)} has a fixed batch dim"] if fixed else [])
    if not reasons:
        return None
    send = f"; clients send {', '.join(constant)} with every request" if constant else ""
    return (f"{'; '.join(reasons)}: Triton batches on axis 0 only, so the model is exported with max_batch_size 0 "
            f"(each request runs as sent, no dynamic batching){send}")


def differences(config: ServingConfig) -> list[str]:
    """What this model does differently on Triton than under `temper serve`, one phrase each."""
    reason = no_batching(config)
    if reason is not None:
        return [f"{reason}: max_batch_size, max_delay_ms, max_queue and timeout_s do not apply"]
    row: Provider = config.engine or "cpu"
    found = engines.of(row).triton_differences(row, config.session)
    if config.max_delay_ms > 0:
        found.append(f"a lone request waits the full {config.max_delay_ms:g} ms max_queue_delay for a batch "
                     "(temper serve waits only while concurrent clients keep arriving)")
    found.append(f"the {config.timeout_s:g} s timeout covers time queued only, not execution")
    if config.pad:
        found.append(f"no padding ({', '.join(config.pad)}): Triton batches only requests of one shape, so "
                     "requests of other lengths run in separate batches (pad on the client to batch them)")
    return found


def _model_config(config: ServingConfig, instances: int, kind: str, runtime: dict[str, Any]) -> dict:
    """ModelConfig (model_config.proto) as nested dicts, in the writer's terms; `runtime`: the engine's
    own fields (its platform or backend, session parameters: artifacts/engines/)."""
    batching = no_batching(config) is None
    fields: dict = {"name": config.name}
    if "backend" in runtime:  # a backend, not a platform; it reads the ONNX file itself
        fields |= {"backend": runtime["backend"], "default_model_filename": MODEL}
    else:
        fields["platform"] = runtime["platform"]
    fields |= {
        "max_batch_size": config.max_batch_size if batching else 0,
        "input": [_io(spec, batching) for spec in config.inputs],
        "output": [_io(spec, batching) for spec in config.outputs],
        "instance_group": [{"count": instances, "kind": _Enum(kind)}],
    }
    if batching:
        fields["dynamic_batching"] = {
            "preferred_batch_size": [config.max_batch_size],  # Triton's own default, stated
            "max_queue_delay_microseconds": round(config.max_delay_ms * 1000),
            "default_queue_policy": {
                "timeout_action": _Enum("REJECT"),
                "default_timeout_microseconds": round(config.timeout_s * 1_000_000),
                "max_queue_size": config.max_queue,
            },
        }
    fields |= {key: value for key, value in runtime.items() if key not in ("backend", "platform", "parameters")}
    if runtime.get("parameters"):  # a protobuf map: {key: {string_value}} in JSON, repeated key/value in text
        fields["parameters"] = _Map({key: {"string_value": value} for key, value in runtime["parameters"].items()})
    sizes = sorted({1, config.max_batch_size}) if batching else [1]
    if not any(spec.value is not None for spec in config.inputs):  # zeros are not a constant's value
        fields["model_warmup"] = [_warmup(config.inputs, size, batching) for size in sizes]
    return fields


def _dims(spec: TensorSpec, batching: bool) -> list[int]:
    """Triton dims: without the batch dim when Triton batches, the full shape when it cannot ([] for a
    scalar, which Triton cannot batch)."""
    return spec.shape[1:] if batching else spec.shape


def _io(spec: TensorSpec, batching: bool) -> dict:
    io: dict = {"name": spec.name, "data_type": _Enum(DATA_TYPES[spec.dtype])}
    dims = _dims(spec, batching)
    if dims:
        io["dims"] = dims
    else:  # a [batch] tensor or a scalar: one element per request, which Triton spells dims [1] + empty reshape
        io["dims"] = [1]
        io["reshape"] = {"shape": []}
    return io


def _warmup(inputs: list[TensorSpec], batch_size: int, batching: bool) -> dict:
    """One warm-up request of zeros: random bytes as token ids could index past a vocabulary."""
    return {
        "name": f"batch_{batch_size}",
        "batch_size": batch_size,
        "inputs": [
            {
                "key": spec.name,
                "value": {
                    "data_type": _Enum(DATA_TYPES[spec.dtype]),
                    "dims": [WARMUP_DIM if d == -1 else d for d in _dims(spec, batching)] or [1],
                    "zero_data": True,
                },
            }
            for spec in inputs
        ],
    }


def _pbtxt(fields: dict, depth: int = 0) -> str:
    """Protobuf text format: messages as blocks, repeated messages as repeated blocks (a map
    is a repeated key/value message), repeated scalars as `[a, b]` lists."""
    pad = "  " * depth
    lines: list[str] = []
    for key, value in fields.items():
        if isinstance(value, _Map):
            entries = [{"key": k, "value": v} for k, v in value.items()]
            lines.extend(f"{pad}{key} {{\n{_pbtxt(entry, depth + 1)}{pad}}}\n" for entry in entries)
        elif isinstance(value, dict):
            lines.append(f"{pad}{key} {{\n{_pbtxt(value, depth + 1)}{pad}}}\n")
        elif isinstance(value, list) and value and isinstance(value[0], dict):
            lines.extend(f"{pad}{key} {{\n{_pbtxt(item, depth + 1)}{pad}}}\n" for item in value)
        elif isinstance(value, list):
            lines.append(f"{pad}{key}: [{', '.join(map(_scalar, value))}]\n")
        else:
            lines.append(f"{pad}{key}: {_scalar(value)}\n")
    return "".join(lines)


def _scalar(value: object) -> str:
    if isinstance(value, _Enum):
        return str(value)
    if isinstance(value, str):
        escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        return f'"{escaped}"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    raise TypeError(f"no text-format writer for {type(value).__name__}")
