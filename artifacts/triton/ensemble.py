"""`temper export-ensemble NAME=STAGE1,STAGE2[,...] --dest REPO`: a Triton ensemble that chains models of a
model repository, one after the other, written as Triton's own config.pbtxt (so Triton runs it, and `temper
serve REPO` serves it: artifacts/formats/ensemble.py reads the same file).

    <repo>/<name>/
      config.pbtxt     platform "ensemble", its inputs (the first stage's), its outputs (the last stage's), and
                       ensemble_scheduling: one step per stage, model_version -1 (the version served)
      1/.keep          the version folder Triton needs; empty but for this file, which keeps it on object
                       stores (S3, GCS) where an empty folder does not exist
      .temper-output   the marker that lets a later export replace this folder

Each stage is a model already in the repository (what `temper export-triton` wrote), read as `temper serve`
reads it: its highest version's runtime.json, or another ensemble's config.pbtxt. How stage k's inputs are fed
(`wire`): an input named like one of stage k-1's outputs takes that output; else one named like an ensemble
input takes that input (a mask passed along); else, when exactly one input and one output are left, the one
takes the other. Anything else is one line naming the input, with the stage's outputs: rename a tensor, or write
the config.pbtxt by hand (Triton's format, which `temper serve` reads as it is). Every edge must agree on dtype and
on every dim both sides fix. Only the outputs a later stage takes are mapped (Triton lets the rest go); the last
stage's outputs are the ensemble's. The ensemble batches when every stage does (max_batch_size: the smallest of
theirs, as Triton requires it to be at most each composing model's), and not at all when none does; a mix
is refused (Triton batches on axis 0 only, and a stage that cannot batch takes full shapes).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from temper.artifacts.core.folders import MARKER, mark, replaceable
from temper.artifacts.formats.bundle import ServingConfig, TensorSpec
from temper.artifacts.formats.ensemble import CONFIG, LATEST, PLATFORM
from temper.artifacts.formats.repository import LoadFailed, ModelRepository
from temper.artifacts.triton.config import VERSION_NAME, _io, _Map, _pbtxt, folder_name, no_batching

PLACEHOLDER = ".keep"


class CannotChain(ValueError):
    """Stages that cannot be chained as asked: one line naming the stage and the tensor."""


def wire(stages: list[tuple[str, ServingConfig]]) -> list[tuple[dict[str, str], dict[str, str]]]:
    """Per stage, (input_map, output_map): the model's tensor -> the ensemble tensor (see the module docstring).
    The ensemble's inputs are the first stage's inputs, its outputs the last stage's outputs, by their names;
    a tensor in between is named STAGE.OUTPUT."""
    first, last = stages[0][1], stages[-1][1]
    ensemble_inputs = {s.name: s for s in first.inputs}
    clash = sorted(set(ensemble_inputs) & {s.name for s in last.outputs})
    if clash:
        raise CannotChain(f"the first stage's input and the last stage's output {', '.join(clash)} would be one "
                          "ensemble tensor: rename one of them")
    maps: list[tuple[dict[str, str], dict[str, str]]] = [({s.name: s.name for s in first.inputs}, {})]
    for (before, previous), (model, config) in zip(stages, stages[1:]):
        offered = {s.name: s for s in previous.outputs}
        inputs: dict[str, str] = {}
        left = [s for s in config.inputs]
        for spec in list(left):
            if spec.name in offered:
                inputs[spec.name] = _edge(before, offered[spec.name], model, spec)
                left.remove(spec)
            elif spec.name in ensemble_inputs:
                _fits(f"the ensemble input '{spec.name}'", ensemble_inputs[spec.name], model, spec)
                inputs[spec.name] = spec.name
                left.remove(spec)
        unused = [s for s in previous.outputs if f"{before}.{s.name}" not in inputs.values()]
        if len(left) == 1 and len(unused) == 1:
            inputs[left[0].name] = _edge(before, unused[0], model, left[0])
        elif left:
            raise CannotChain(f"stage '{model}' input '{left[0].name}' matches no output of '{before}' (it gives "
                              f"{', '.join(offered)}) nor an ensemble input: name the tensors alike, or write the "
                              "ensemble's config.pbtxt by hand")
        maps[-1][1].update({output: tensor for output in offered
                            if (tensor := f"{before}.{output}") in inputs.values()})
        maps.append((inputs, {}))
    maps[-1][1].update({s.name: s.name for s in last.outputs})
    return maps


def _edge(before: str, output: TensorSpec, model: str, spec: TensorSpec) -> str:
    _fits(f"'{before}' output '{output.name}'", output, model, spec)
    return f"{before}.{output.name}"


def _fits(source: str, given: TensorSpec, model: str, taken: TensorSpec) -> None:
    """CannotChain unless the tensor given can be the input taken: one dtype, one rank, no fixed dim differing."""
    if given.dtype != taken.dtype:
        raise CannotChain(f"{source} is {given.dtype} but stage '{model}' input '{taken.name}' is {taken.dtype}")
    if len(given.shape) != len(taken.shape) or any(a > 0 and b > 0 and a != b for a, b in zip(given.shape,
                                                                                              taken.shape)):
        raise CannotChain(f"{source} has shape {given.shape} but stage '{model}' input '{taken.name}' takes "
                          f"{taken.shape} (-1: any size)")


def ensemble_config(name: str, stages: list[tuple[str, ServingConfig]]) -> dict:
    """The ensemble's ModelConfig fields (artifacts/triton/config.py's writer terms)."""
    if len(stages) < 2:
        raise CannotChain("an ensemble chains two stages or more")
    batching = [no_batching(config) is None for _, config in stages]
    if any(batching) and not all(batching):
        odd = [model for (model, _), batches in zip(stages, batching) if not batches]
        raise CannotChain(f"stage(s) {', '.join(odd)} cannot batch while the others do: Triton cannot run them in "
                          "one batching ensemble (export them with a batch dim first)")
    maps = wire(stages)
    return {
        "name": name, "platform": PLATFORM,
        "max_batch_size": min(config.max_batch_size for _, config in stages) if batching[0] else 0,
        "input": [_io(spec, batching[0]) for spec in stages[0][1].inputs],
        "output": [_io(spec, batching[0]) for spec in stages[-1][1].outputs],
        "ensemble_scheduling": {"step": [
            {"model_name": model, "model_version": LATEST, "input_map": _Map(inputs), "output_map": _Map(outputs)}
            for (model, _), (inputs, outputs) in zip(stages, maps)]},
    }


def export_ensemble(repo: Path, name: str, stages: list[str], version: str = "1") -> Path:
    """Write repo/NAME/config.pbtxt and its version folder (module docstring); the model folder. ValueError (a
    CannotChain, LoadFailed, a folder temper did not write) says what is wrong, before anything is written."""
    folder_name(name)
    if not VERSION_NAME.fullmatch(version):
        raise ValueError(f"version {version!r} is not a Triton version folder name (1, 2, ...: no leading 0)")
    repository = ModelRepository(repo)
    if name in stages:
        raise CannotChain(f"the ensemble '{name}' cannot be one of its own stages")
    configs = []
    for stage in stages:
        if stage not in repository.names():
            raise LoadFailed(f"no model '{stage}' in the repository {repo} (it has: "
                             f"{', '.join(repository.names()) or 'none'}): export it there first")
        configs.append((stage, repository.locate(stage).serving_config()))
    text = _pbtxt(ensemble_config(name, configs))
    folder = repo / name
    if not replaceable(folder):
        raise FileExistsError(f"{folder} exists and temper did not write it (no {MARKER} marker): delete it or "
                              "choose another name")
    staging = repo / f".{name}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        (staging / version).mkdir(parents=True)
        (staging / version / PLACEHOLDER).write_text("")
        (staging / CONFIG).write_text(text)
        mark(staging, model=name, ensemble=",".join(stages))
        shutil.rmtree(folder, ignore_errors=True)
        staging.rename(folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder

