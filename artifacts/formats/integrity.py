"""Whether a folder's model files are the ones its manifest.json records, before anything trusts them.

`temper run` records each model's sha256 and size in manifest.json; a published bundle ships that
manifest and the report naming its model. A file replaced afterwards (by hand, a bad copy, a sync tool)
would otherwise be gated, served or exported under the run's name. This is a consistency check
against the folder's own manifest, not a signature: whoever can rewrite both can fool it.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import onnx
from onnx.external_data_helper import ExternalDataInfo, _get_all_tensors

MANIFEST = "manifest.json"
REPORT = "report.json"
MODEL = "model.onnx"
BASELINE = "baseline"
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")  # a candidate name as a recipe spells it: one path part


class Mismatch(ValueError):
    """A model file the manifest does not vouch for; `file` is the file, the message says what to do."""

    def __init__(self, file: Path, message: str) -> None:
        self.file = file
        super().__init__(message)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def content_digests(path: Path, model: onnx.ModelProto) -> list[str]:
    """The sha256 of the model file and of each external data file its graph names (`model`: its structure):
    what a result computed from the model (outputs, calibrated ranges) is keyed on."""
    files = [path, *sorted({path.parent / e.value for i in model.graph.initializer for e in i.external_data
                            if e.key == "location"})]
    return [sha256_of(f) for f in files]


def read_manifest(folder: Path, remedy: str) -> dict[str, Any]:
    """manifest.json as a mapping (Mismatch when it cannot be read or is not temper's)."""
    path = folder / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as exc:  # truncated, edited by hand, not text
        raise Mismatch(path, f"cannot be read ({type(exc).__name__}): {remedy}") from None
    if not isinstance(manifest, dict):
        raise Mismatch(path, f"is not a temper manifest (not a mapping): {remedy}")
    recipe = manifest.get("recipe")
    for key, value in (("candidates", manifest.get("candidates")),
                       ("recipe.resolved", recipe.get("resolved") if isinstance(recipe, dict) else None)):
        if not isinstance(value, dict):  # another tool's manifest.json, or one cut short
            raise Mismatch(path, f"is not a temper manifest (no {key} mapping): {remedy}")
    return manifest


def candidate_name(manifest: dict[str, Any], name: object) -> str:
    """`name` when it names the baseline or a candidate the manifest records as built; ValueError otherwise
    (a path, `..`, an absolute path or an unknown name never reaches the file system)."""
    built = [n for n, entry in manifest["candidates"].items()
             if isinstance(entry, dict) and entry.get("status") == "ok"]
    if not isinstance(name, str) or not _NAME.fullmatch(name) or name not in (BASELINE, *built):
        raise ValueError(f"{name!r} is not the baseline nor a built candidate of its manifest "
                         f"(built: {', '.join([BASELINE, *built])})")
    return name


def recorded(manifest: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The manifest's record (sha256, bytes) of the baseline's or a candidate's final model."""
    entry = manifest.get(BASELINE) if name == BASELINE else manifest["candidates"].get(name)
    model_id = entry.get("model") if isinstance(entry, dict) else None
    models = manifest.get("models")
    for record in models if isinstance(models, list) else ():
        if isinstance(record, dict) and record.get("id") == model_id and isinstance(record.get("sha256"), str):
            return record
    return None


def check_model(path: Path, name: str, manifest: dict[str, Any], remedy: str) -> None:
    """Raise Mismatch unless `path` has the size and sha256 the manifest records for `name`'s model."""
    record = recorded(manifest, name)
    if record is None:
        raise Mismatch(path, f"{MANIFEST} records no sha256 for {name}, so this file cannot be checked: {remedy}")
    if not path.is_file():
        raise Mismatch(path, f"is missing: {remedy}")
    size = path.stat().st_size
    if record.get("bytes") not in (None, size) or sha256_of(path) != record["sha256"]:
        raise Mismatch(path, f"is not the {name} model {MANIFEST} records (sha256 {record['sha256'][:12]}..., "
                             f"{record.get('bytes')} bytes; this file: {size} bytes): it was changed after temper "
                             f"wrote it; {remedy}")
    _check_external_data(path, remedy)


def _check_external_data(path: Path, remedy: str) -> None:
    """Mismatch when a weight file the model refers to is missing or too short for its tensors: the manifest's
    sha256 covers model.onnx alone, and ONNX Runtime's refusal would come later, as a traceback."""
    needs: dict[str, int] = {}
    for tensor in _get_all_tensors(onnx.load(str(path), load_external_data=False)):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            info = ExternalDataInfo(tensor)
            end = (info.offset or 0) + (info.length or 0)
            needs[info.location] = max(needs.get(info.location, 0), end)
    for location, end in needs.items():
        data = path.parent / location
        if not data.is_file():
            raise Mismatch(data, f"is missing ({path.name} keeps its weights there): {remedy}")
        if data.stat().st_size < end:
            raise Mismatch(data, f"is {data.stat().st_size} bytes but {path.name} reads {end} from it: it was cut "
                                 f"short; {remedy}")


def check_built_files(folder: Path, names: list[str], manifest: dict[str, Any], remedy: str) -> None:
    """Check OUTPUT/NAME/model.onnx of each name (the baseline and built candidates of a run's output folder)."""
    for name in names:
        check_model(folder / candidate_name(manifest, name) / MODEL, name, manifest, remedy)


def check_bundle(folder: Path, remedy: str) -> str | None:
    """Check a serving bundle's model.onnx against the manifest it ships (the model report.json selected).

    A bundle without a manifest (assembled by hand with bundle.write) cannot be checked: returns the
    warning to show, and it is served as it is. A manifest without a report, or a model that is not
    the one they record, raises Mismatch."""
    if not (folder / MANIFEST).exists():
        return (f"{folder} has no {MANIFEST}, so its {MODEL} cannot be checked against the sha256 temper "
                "recorded: it is used as it is (a bundle temper publishes carries one)")
    manifest = read_manifest(folder, remedy)
    try:
        selected = json.loads((folder / REPORT).read_text())["selected"]
    except (OSError, ValueError, KeyError, TypeError):
        raise Mismatch(folder / REPORT, f"is missing or names no selected model, so {MODEL} cannot be checked "
                                        f"against {MANIFEST}: {remedy}") from None
    try:
        name = candidate_name(manifest, selected)
    except ValueError as exc:
        raise Mismatch(folder / REPORT, f"selected: {exc}: {remedy}") from None
    check_model(folder / MODEL, name, manifest, remedy)
    return None
