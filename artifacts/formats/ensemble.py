"""Triton ensembles in a model repository: a model that chains other models of the repository.

An ensemble's folder holds Triton's config.pbtxt with `platform: "ensemble"` and an `ensemble_scheduling` of
steps, each naming a composing model, its version (-1: the one served) and two maps: `input_map` (the composing
model's input -> the ensemble tensor it takes) and `output_map` (its output -> the ensemble tensor it gives).
Ensemble tensors are the ensemble's inputs, its outputs and any name in between; its version folder (`1/`) is
empty, as Triton's is. The file is parsed with Triton's own ModelConfig schema (tritonclient's model_config_pb2,
google.protobuf's text format), so what temper serves is what Triton reads: that needs the `grpc` extra
(SchemaMissing otherwise).

`parse` reads the file; `check` holds it against the composing models' ServingConfigs, as Triton checks it at
load: every step's model is in the repository, serves the version asked, is given every input it needs (a
constant input may be left out, as with a request) from an ensemble input or one step's output, and its
outputs are mapped to tensors no other step or input also gives; every ensemble output is given by a step;
no step waits on itself (a cycle); dtypes agree along every edge. Each failure is one line (LoadFailed).
artifacts/serving/ensemble_runtime.py runs a checked ensemble; artifacts/triton/ensemble.py writes one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from temper.artifacts.formats.bundle import ServingConfig, TensorSpec

CONFIG = "config.pbtxt"
PLATFORM = "ensemble"
LATEST = -1  # a step's model_version that takes the version served (Triton's default)
DECLARES = re.compile(r'^\s*platform\s*:\s*"ensemble"', re.MULTILINE)
DTYPES = {"TYPE_FP32": "float32", "TYPE_FP16": "float16", "TYPE_INT64": "int64", "TYPE_INT32": "int32",
          "TYPE_INT8": "int8", "TYPE_UINT8": "uint8", "TYPE_BOOL": "bool"}


class EnsembleError(LookupError):
    """An ensemble config that cannot serve (repository.LoadFailed wraps it with the model's name)."""


class SchemaMissing(EnsembleError):
    """Triton's ModelConfig schema (tritonclient) is not installed: an environment problem, not the config's."""


@dataclass(frozen=True)
class Step:
    """One step: the composing model, the version asked (-1: served), and its tensors -> ensemble tensors."""

    model: str
    version: int
    inputs: dict[str, str]  # the model's input -> the ensemble tensor it takes
    outputs: dict[str, str]  # the model's output -> the ensemble tensor it gives


@dataclass(frozen=True)
class EnsembleSpec:
    """A parsed ensemble: its tensors as a ServingConfig (what the servers check requests against), its steps in
    the file's order, and the config as Triton's JSON (what /config answers)."""

    config: ServingConfig
    steps: tuple[Step, ...]
    document: dict[str, Any]

    @property
    def models(self) -> list[str]:
        """The composing models, each once, in the order the steps name them."""
        return list(dict.fromkeys(step.model for step in self.steps))


def declares(model_folder: Path) -> bool:
    """Whether a repository's model folder holds an ensemble (its config.pbtxt says `platform: "ensemble"`)."""
    try:
        return bool(DECLARES.search((model_folder / CONFIG).read_text()))
    except (OSError, UnicodeDecodeError):
        return False


def parse(model_folder: Path, name: str) -> EnsembleSpec:
    """The ensemble in `model_folder`/config.pbtxt, served as `name` (EnsembleError: what is wrong with it)."""
    try:
        from google.protobuf import text_format
        from tritonclient.grpc import model_config_pb2 as mc
    except (ImportError, RuntimeError) as exc:  # tritonclient reports a missing grpcio as a RuntimeError
        raise SchemaMissing(f"serving the ensemble '{name}' reads its {CONFIG} with Triton's ModelConfig schema, "
                            f"which needs the grpc extra (pip install 'temper-ml[grpc]'): {exc}") from exc
    path = model_folder / CONFIG
    try:
        parsed = text_format.Parse(path.read_text(), mc.ModelConfig())
    except (OSError, text_format.ParseError) as exc:
        raise EnsembleError(f"{path} does not parse as Triton's ModelConfig: {exc}") from exc
    if parsed.platform != PLATFORM:
        raise EnsembleError(f"{path} is not an ensemble (platform {parsed.platform!r})")
    if parsed.name and parsed.name != name:
        raise EnsembleError(f"{path} names the model '{parsed.name}', not its folder's name '{name}' (Triton "
                            "refuses that too)")
    batching = parsed.max_batch_size > 0
    inputs = [_spec(path, "input", io, batching, mc) for io in parsed.input]
    outputs = [_spec(path, "output", io, batching, mc) for io in parsed.output]
    if not inputs or not outputs:
        raise EnsembleError(f"{path} declares no {'input' if not inputs else 'output'}")
    steps = tuple(Step(s.model_name, s.model_version, dict(s.input_map), dict(s.output_map))
                  for s in parsed.ensemble_scheduling.step)
    if not steps:
        raise EnsembleError(f"{path} has no ensemble_scheduling step")
    config = ServingConfig(name=name, inputs=inputs, outputs=outputs, max_batch_size=max(1, parsed.max_batch_size),
                           max_delay_ms=0)
    document = {
        "name": name, "platform": PLATFORM, "max_batch_size": parsed.max_batch_size,
        "input": [_io(io, mc) for io in parsed.input], "output": [_io(io, mc) for io in parsed.output],
        "ensemble_scheduling": {"step": [{"model_name": s.model, "model_version": s.version,
                                          "input_map": s.inputs, "output_map": s.outputs} for s in steps]},
    }
    return EnsembleSpec(config, steps, document)


def _spec(path: Path, kind: str, io: Any, batching: bool, mc: Any) -> TensorSpec:
    """An ensemble input or output as a TensorSpec: rows on axis 0 when the ensemble batches (dims then leave
    the batch dim out, as Triton's do), the full shape and no batch axis when it does not."""
    data_type = mc.DataType.Name(io.data_type)
    if data_type not in DTYPES:
        raise EnsembleError(f"{path}: {kind} '{io.name}' is {data_type}; temper serves "
                            f"{', '.join(DTYPES)}")
    dims = list(io.reshape.shape) if io.HasField("reshape") else list(io.dims)
    if any(d < -1 for d in dims):
        raise EnsembleError(f"{path}: {kind} '{io.name}' has dims {dims} (-1 or more)")
    shape = [-1, *dims] if batching else dims
    return TensorSpec(name=io.name, dtype=DTYPES[data_type], shape=shape, batch_axis=0 if batching else None)


def _io(io: Any, mc: Any) -> dict[str, Any]:
    found: dict[str, Any] = {"name": io.name, "data_type": mc.DataType.Name(io.data_type), "dims": list(io.dims)}
    if io.HasField("reshape"):
        found["reshape"] = {"shape": list(io.reshape.shape)}
    return found


def check(spec: EnsembleSpec, composing: dict[str, tuple[str, ServingConfig]]) -> EnsembleSpec:
    """The ensemble held against its composing models (`composing`: name -> (version served, its config)), with
    its queue bound and timeout taken from them (the largest queue; the stages' timeouts summed, each stage
    being allowed its own). EnsembleError names the first problem."""
    name = spec.config.name
    given: dict[str, tuple[str, str]] = {s.name: ("the ensemble's input", s.dtype) for s in spec.config.inputs}
    for step in spec.steps:
        if step.model not in composing:
            raise EnsembleError(f"ensemble '{name}': step model '{step.model}' is not in the repository")
        version, config = composing[step.model]
        if step.version not in (LATEST, int(version)):
            raise EnsembleError(f"ensemble '{name}': step model '{step.model}' version {step.version} is not the "
                                f"one served ({version}, the highest): use model_version -1")
        outputs = {s.name: s for s in config.outputs}
        for output, tensor in step.outputs.items():
            if output not in outputs:
                raise EnsembleError(f"ensemble '{name}': '{step.model}' has no output '{output}' (it has "
                                    f"{', '.join(outputs)})")
            if tensor in given:
                raise EnsembleError(f"ensemble '{name}': tensor '{tensor}' is given twice: by {given[tensor][0]} "
                                    f"and by '{step.model}'")
            given[tensor] = (f"'{step.model}' output '{output}'", outputs[output].dtype)
    for step in spec.steps:
        config = composing[step.model][1]
        inputs = {s.name: s for s in config.inputs}
        for model_input, tensor in step.inputs.items():
            if model_input not in inputs:
                raise EnsembleError(f"ensemble '{name}': '{step.model}' has no input '{model_input}' (it takes "
                                    f"{', '.join(inputs)})")
            if tensor not in given:
                raise EnsembleError(f"ensemble '{name}': '{step.model}' input '{model_input}' takes '{tensor}', "
                                    "which no ensemble input or step output gives")
            if given[tensor][1] != inputs[model_input].dtype:
                raise EnsembleError(f"ensemble '{name}': '{step.model}' input '{model_input}' is "
                                    f"{inputs[model_input].dtype} but {given[tensor][0]} '{tensor}' is "
                                    f"{given[tensor][1]}")
        missing = [s.name for s in config.inputs if s.name not in step.inputs and s.value is None]
        if missing:
            raise EnsembleError(f"ensemble '{name}': step '{step.model}' maps no tensor to its input(s) "
                                f"{', '.join(missing)}")
    for spec_out in spec.config.outputs:
        origin = given.get(spec_out.name)
        if origin is None or origin[0] == "the ensemble's input":
            raise EnsembleError(f"ensemble '{name}': no step gives its output '{spec_out.name}'")
        if origin[1] != spec_out.dtype:
            raise EnsembleError(f"ensemble '{name}': output '{spec_out.name}' is {spec_out.dtype} but {origin[0]} "
                                f"is {origin[1]}")
    order(spec)
    configs = [composing[m][1] for m in spec.models]
    config = spec.config.model_copy(update={"max_queue": max(c.max_queue for c in configs),
                                            "timeout_s": sum(c.timeout_s for c in configs)})
    return replace(spec, config=config)


def order(spec: EnsembleSpec) -> list[Step]:
    """The steps in an order that runs each after the steps it takes tensors from; EnsembleError on a cycle."""
    ready = {s.name for s in spec.config.inputs}
    left, done = list(spec.steps), []
    while left:
        runnable = [s for s in left if set(s.inputs.values()) <= ready]
        if not runnable:
            raise EnsembleError(f"ensemble '{spec.config.name}': steps {', '.join(s.model for s in left)} wait on "
                                "each other's outputs (a cycle)")
        for step in runnable:
            left.remove(step)
            done.append(step)
            ready |= set(step.outputs.values())
    return done
