"""The run's output folder: staged beside the target and swapped in whole, so a failed or interrupted
run never leaves a folder that looks like a finished one."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from onnx.external_data_helper import _get_all_tensors

from temper.artifacts.core.errors import RecipeError, first_line, unwritable
from temper.artifacts.core.folders import (
    MARKER,
    claim,
    copy_into,
    discard,
    mark,
    replaceable,
    require_writable,
    swap_in,
    sweep,
)
from temper.artifacts.core.host import profile
from temper.artifacts.core.layout import Layout
from temper.artifacts.core.onnx_io import load_structure
from temper.pipeline.cache import MODEL_FILE, TUNING_FILE, key_of, library_versions
from temper.pipeline.loading import LoadedRecipe
from temper.pipeline.recipe import Recipe
from temper.pipeline.runner import ModelRecord, RunResult
from temper.validators import report

if TYPE_CHECKING:
    from temper.artifacts.formats.bundle import ServingConfig

MANIFEST = "manifest.json"


# Recipe keys that cannot change a built model: the gates (re-gating is what `temper validate` is for), the
# recipe's name, where the selected model is published, and the target (a build sees it only through the
# presets it resolves, which are in the steps' options).
NOT_BUILD = {"validation", "select", "name", "publish", "target"}
_GATES = {"validation", "select"}  # what manifests written before name, publish and target left NOT_BUILD excluded


def build_fingerprint(recipe: Recipe) -> str:
    """Hash of everything that shapes the models: `temper validate` re-gates only matching builds."""
    return key_of(**recipe.model_dump(mode="json", by_alias=True, exclude=NOT_BUILD))


def same_build(recorded: object, recipe: Recipe) -> bool:
    """A manifest's `build_sha256` is this recipe's build (an older manifest's: with the same name, publish
    section and target too, as its fingerprint held them)."""
    return recorded in (build_fingerprint(recipe), key_of(**recipe.model_dump(mode="json", by_alias=True,
                                                                               exclude=_GATES)))


class OutputFolder:
    def __init__(self, target: Path, committed: list[Path] | None = None) -> None:
        """Check now, before any heavy work, that `target` can be written and is temper's to replace;
        remove what dead runs left beside it. `committed` hears the folder once it is in place (what an
        interruption after that leaves behind: the CLI says so)."""
        self.target = target.resolve()
        self.committed = committed
        if self.target.exists() and not self.target.is_dir():
            raise RecipeError(str(target), "--output", "exists and is not a folder")
        if not replaceable(self.target):
            raise RecipeError(str(target), "--output", _not_ours(self.target))
        prefix = f".{self.target.name}.partial-"
        try:
            self.target.parent.mkdir(parents=True, exist_ok=True)
            sweep(self.target.parent, prefix)
            self.staging = claim(self.target.parent, prefix)
        except OSError as exc:
            raise RecipeError(str(target), "--output",
                              f"not writable ({exc.strerror}); choose a folder you can write") from None

    def discard(self) -> None:
        discard(self.staging)

    def commit(self, loaded: LoadedRecipe, result: RunResult, reports: Callable[[Path], object] | None = None) -> Path:
        """Copy each final model into the staging folder, write the manifest (and `reports` into the
        folder, when given) and the marker, then swap it into place."""
        try:
            _copy_model(result.baseline[-1], self.staging / "baseline")
            for outcome in result.candidates:
                if outcome.model is not None:
                    _copy_model(outcome.model, self.staging / outcome.name)
            if reports is not None:
                reports(self.staging)
            (self.staging / MANIFEST).write_text(json.dumps(manifest(loaded, result), indent=2) + "\n")
            mark(self.staging, recipe=loaded.recipe.name)
            self._swap()
        except OSError as exc:
            raise unwritable(self.target, "--output", exc, "the output folder") from exc
        if self.committed is not None:
            self.committed.append(self.target)
        return self.target

    @classmethod
    def existing(cls, target: Path) -> OutputFolder:
        """An earlier run's folder whose reports `temper validate` rewrites: checked, like a new one, before the
        gates run; this user must be able to write it (replacing it whole needs only its parent)."""
        try:
            require_writable(target)
        except OSError as exc:
            raise unwritable(target, "--output", exc, "the output folder") from exc
        return cls(target)

    def rewrite(self, reports: Callable[[Path], object]) -> Path:
        """The folder again with new `reports`: its other files hard-linked into the staging folder (no model
        is copied), the reports written there and the folder swapped in whole, as `commit` does; a full disk, a
        read-only folder or an interruption leaves the folder exactly as it was."""
        try:
            copy_into(self.target, self.staging, link=True, skip=self._report_file)
            reports(self.staging)
            self._swap()
        except OSError as exc:
            raise unwritable(self.target, "--output", exc, "the output folder") from exc
        return self.target

    def _report_file(self, relative: Path) -> bool:
        return len(relative.parts) == 1 and report.is_output(relative.name) and (self.target / relative).is_file()

    def _swap(self) -> None:
        """Put the staged folder in place of the target; if that is interrupted half-way, the
        previous output goes back where it was."""
        if not replaceable(self.target):  # checked before the build too: something may have moved in since
            raise RecipeError(str(self.target), "--output", _not_ours(self.target))
        swap_in(self.staging, self.target)


def _not_ours(target: Path) -> str:
    """Why `target` may not be replaced, and what to do."""
    if (target / MANIFEST).is_file():
        return (f"holds a {MANIFEST} but no {MARKER} marker: an older temper's output or another tool's; "
                "delete it or choose another folder")
    return (f"exists, is not empty and holds no temper {MANIFEST} nor {MARKER} marker; "
            "delete it or choose another folder")


def _copy_model(record: ModelRecord, folder: Path) -> None:
    """The model as model.onnx, byte for byte (its sha256 is the manifest's), with what it needs beside it.
    A cached model sits in its own folder with its external data and tuning.json; the baseline of a recipe
    without shared steps is the user's ONNX file, under any name, among files that are not its own."""
    folder.mkdir()
    shutil.copy2(record.path, folder / MODEL_FILE)
    if record.path.name == MODEL_FILE:
        beside = [item.name for item in record.path.parent.iterdir()
                  if item.name == TUNING_FILE or item.name.startswith(MODEL_FILE + ".")]
    else:  # only the external-data files its graph refers to, under the names it refers to them by
        beside = sorted({entry.value for tensor in _get_all_tensors(load_structure(record.path))
                         for entry in tensor.external_data if entry.key == "location"
                         and not Path(entry.value).is_absolute() and ".." not in Path(entry.value).parts})
    for name in beside:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(record.path.parent / name, folder / name)


def manifest(loaded: LoadedRecipe, result: RunResult) -> dict[str, Any]:
    """Lineage of every model: parent, step, options, sha256, size, seconds, and the library versions."""
    records = {r.id: r for r in result.baseline}
    for outcome in result.candidates:
        records.update({r.id: r for r in outcome.records})
    return {
        "recipe": {"name": loaded.recipe.name, "file": loaded.file, "sha256": loaded.sha256,
                   "resolved": loaded.recipe.model_dump(mode="json", by_alias=True)},
        "build_sha256": build_fingerprint(loaded.recipe),
        "versions": library_versions(),
        "host": profile().model_dump(),  # the machine that built (and, with validate, gated) these models
        "baseline": {"model": result.baseline[-1].id, "path": f"baseline/{MODEL_FILE}"},
        "candidates": {
            o.name: {"status": "failed" if o.error else "ok", "model": o.model.id if o.model else None,
                     "path": f"{o.name}/{MODEL_FILE}" if o.model else None, "error": o.error}
            for o in result.candidates
        },
        "models": [r.as_dict() for r in records.values()],
        "layout": {"outputs": result.output_axes},  # each output's batch axis, found on the baseline
    }


def serving_layout(manifest: dict[str, Any]) -> Layout | None:
    """The batch axes and constants a run's manifest records for serving: model.inputs' (resolved) and the
    outputs' found on the baseline; None when it records no model inputs (config_for's defaults then)."""
    inputs = ((manifest.get("recipe") or {}).get("resolved") or {}).get("model", {}).get("inputs")
    if not inputs:
        return None
    return Layout({i["name"]: i.get("batch_axis", 0) for i in inputs},
                  dict((manifest.get("layout") or {}).get("outputs") or {}),
                  {i["name"]: np.asarray(i["value"], dtype=i["dtype"]) for i in inputs if i.get("value") is not None})


REBUILD = "rebuild the folder with `temper run`"


def servable(path: Path) -> tuple[Path, ServingConfig | None]:
    """The model folder `temper serve PATH` serves, and its config when it is not a published bundle.

    PATH is a serving bundle (its runtime.json is the config: returns None; the caller checks it with
    artifacts.formats.integrity.check_bundle), a run's output folder (its selected model) or OUTPUT/CANDIDATE; an
    unpublished model gets the options publishing would give it. The name served must be the baseline or a
    candidate the manifest records as built, and its file the one the manifest records (Mismatch).
    Raises ValueError saying what PATH is not.
    """
    from temper.artifacts.formats.bundle import CONFIG, config_for
    from temper.artifacts.formats.integrity import Mismatch, candidate_name, check_model, read_manifest
    from temper.validators import report_model

    path = path.resolve()  # `OUT/fast/..` is OUT, and a link is its target: what is checked is what serves
    if (path / CONFIG).is_file():
        return path, None
    output = path if (path / MANIFEST).is_file() else path.parent
    if not (path.is_dir() and (output / MANIFEST).is_file()):
        raise ValueError(f"neither a serving bundle folder ({MODEL_FILE} + {CONFIG}), a run's output folder or a "
                         "model in one, nor a models:/NAME@ALIAS or /NAME/VERSION URI")
    report_file = output / report_model.FILE
    try:
        manifest = read_manifest(output, REBUILD)
        report = report_model.load(report_file) if report_file.is_file() else None
        if path == output:  # the run's selection: the baseline when no candidate passed
            if report is None:
                raise ValueError("it has no report.json (the recipe has no validate section), so it names no selected "
                                 "model; serve OUTPUT/CANDIDATE")
            name = candidate_name(manifest, report.selected)  # never a path: `../x` or `/x` names no candidate
            pair = report.selected_pair
        else:
            name = pair = candidate_name(manifest, path.name)  # OUTPUT/CANDIDATE: on the first engine
        recipe = manifest["recipe"]["resolved"]
        publish = recipe.get("publish") or {}
        served = publish.get("mlflow") or {}
        gated = report.session_of(pair) if report and pair in {"baseline", *report.candidates} else None
        engine = report.candidates[pair].engine if report and pair in report.candidates else (
            report.baseline.engine if report else None)
        dependent = bool(report and pair in {"baseline", *report.candidates}
                         and report_model.batch_dependent(report, pair))
    except Mismatch:  # a damaged manifest, or another tool's: the line names manifest.json
        raise
    except Exception as exc:  # a failed candidate (no model), a damaged report
        raise ValueError(f"cannot serve it from its run: {first_line(exc)}") from exc
    check_model(output / name / MODEL_FILE, name, manifest, REBUILD)
    try:
        return output / name, config_for(output / name / MODEL_FILE, served.get("registered_model") or recipe["name"],
                                         serving_layout(manifest), measured_on=report.host if report else None,
                                         engine=engine, session=gated, batch_dependent=dependent,
                                         **(publish.get("serving") or {}))
    except Exception as exc:  # a model onnx cannot read, serving options this version does not know
        raise ValueError(f"cannot serve it from its run: {first_line(exc)}") from exc


def backup_of(output: Path, served: str | None = None) -> str | None:
    """The burst fallback's backup in a run's output folder (artifacts/serving/fallback.py): among the pairs that passed
    every gate on the selected engine, other than the model served (`served`; default the selected one), the
    fastest (samples/s at the largest batch size measured); None when none did, or nothing was measured."""
    from temper.validators import report_model

    report = report_model.load(output / report_model.FILE)
    ranked = []
    for candidate in report.candidates.values():
        if (not candidate.passed or candidate.engine != report.selected_engine
                or candidate.model == (served or report.selected)):
            continue
        if candidate.throughput:
            top = max(m.batch_size for m in candidate.throughput)
            ranked.append((max(m.samples_per_s for m in candidate.throughput if m.batch_size == top), candidate.model))
    return max(ranked)[1] if ranked else None


def backup_beside(model: Path) -> tuple[Path, ServingConfig] | None:
    """A run's model's burst fallback backup (backup_of, other than that model) as servable gives it: its folder and
    the serving config publishing would give it; None outside a run's output folder, or when no other pair passed."""
    output = model.parent
    if not (output / MANIFEST).is_file():
        return None
    name = backup_of(output, model.name)
    if name is None:
        return None
    found, config = servable(output / name)
    assert config is not None  # a model in a run's output folder, never a bundle
    return found, config
