"""`temper serve --burst-fallback-ms`: the backup model (artifacts/serving/fallback.py) each served model gets, checked
before it serves. One bundle: its backup/ folder, or for a run's output folder its fastest other passing pair. A model
repository: each model whose served version folder carries a backup/ (`temper export-triton` copies it there); the
others serve without one, said once at start."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from temper.artifacts.core.errors import RecipeError

if TYPE_CHECKING:
    from temper.artifacts.formats.bundle import ServingConfig
    from temper.artifacts.formats.repository import ModelRepository, Source
    from temper.artifacts.serving.models import Models
    from temper.artifacts.serving.runtime import Runtime

FLAG = "--burst-fallback-ms"
PULL_AGAIN = "pull it again with `temper pull`, or rebuild it with `temper run`"
Build = Callable[["Source", "int | None"], "Runtime"]


def with_backup(model: str, folder: Path, models: Models, instances: int | None, target_ms: float) -> str:
    """Attach the backup model to the one bundle served; the phrase that says so."""
    from temper.artifacts.formats.bundle import backup_folder
    from temper.artifacts.serving.runtime import Runtime
    from temper.pipeline.outputs import backup_beside

    only = models.only()
    assert only is not None, "one bundle serves one model"
    runtime = only.runtime
    assert isinstance(runtime, Runtime), "a single bundle is served by a Runtime"
    found, config = backup_folder(folder), None
    if found is not None:
        _check_backup(model, folder, found)
    elif (beside := backup_beside(folder)) is not None:  # a run's output folder: its fastest other pass
        found, config = beside
    if found is None:
        raise RecipeError(model, FLAG, "no backup model: the bundle has no backup/ folder, and no other pair of its "
                                       "run passed every gate on its engine")
    _attach(model, runtime, found, config, instances, target_ms)
    return f", with the burst fallback to {found.name} over {target_ms:g} ms"


def repository_build(model: str, repository: ModelRepository, target_ms: float | None,
                     warn: Callable[[str | None], None]) -> tuple[Build, str]:
    """How the repository's models are built (with their backups when `target_ms` is set), and the phrase that
    says which models have one. A repository where no model carries a backup refuses the flag: nothing would
    fall back."""
    from temper.artifacts.formats.bundle import backup_folder
    from temper.artifacts.serving.models import runtime_of

    if target_ms is None:
        return runtime_of, ""
    carrying = [name for name in repository.names() if (versions := repository.versions(name))
                and backup_folder(repository.root / name / versions[-1]) is not None]
    if not carrying:
        raise RecipeError(model, FLAG, "no model of the repository carries a backup model (a backup/ folder in its "
                                       "served version, which `temper export-triton` writes from a bundle or run "
                                       "that has one)")
    others = [name for name in repository.names() if name not in carrying]
    if others:
        warn(f"{', '.join(others)}: no backup/ folder in the served version; served without the burst fallback")

    def build(source: Source, instances: int | None) -> Runtime:
        runtime = runtime_of(source, instances)
        found = backup_folder(source.folder)
        if found is not None:
            shown = str(repository.root / source.name / source.version)
            _check_backup(shown, source.folder, found, "export it again with `temper export-triton`")
            _attach(shown, runtime, found, None, instances, target_ms)
        return runtime

    return build, f", with the burst fallback over {target_ms:g} ms for {', '.join(carrying)}"


def _attach(shown: str, runtime: Runtime, found: Path, config: ServingConfig | None, instances: int | None,
            target_ms: float) -> None:
    """The backup's Runtime beside the primary's, both answering the same tensors."""
    from temper.artifacts.serving.fallback import BurstFallback
    from temper.artifacts.serving.runtime import Runtime

    backup = Runtime(found, config=config, instances=instances)
    mine = [(s.name, s.dtype) for s in runtime.config.inputs + runtime.config.outputs]
    if [(s.name, s.dtype) for s in backup.config.inputs + backup.config.outputs] != mine:
        raise RecipeError(shown, FLAG, f"the backup model {found} takes or answers other tensors")
    runtime.fallback = BurstFallback(runtime, backup, target_ms)


def _check_backup(model: str, folder: Path, found: Path, remedy: str = PULL_AGAIN) -> None:
    """A bundle's backup/ model checked against the manifest it ships: the sha256 recorded for the pair its
    report.json names as the backup (the fastest other that passed every gate, pipeline/outputs.py backup_of). A
    bundle without a manifest (made by hand) serves its backup as it is, as it does its model."""
    from temper.artifacts.formats.integrity import REPORT, Mismatch, check_model, read_manifest
    from temper.pipeline.outputs import MANIFEST, backup_of

    if not (folder / MANIFEST).is_file() or not (folder / REPORT).is_file():
        return
    try:
        name = backup_of(folder)
        if name is None:
            raise Mismatch(found, f"is a backup model, but {REPORT} names no other pair that passed every gate on the "
                                  f"selected engine: {remedy}")
        check_model(found / "model.onnx", name, read_manifest(folder, remedy), remedy)
    except Mismatch as exc:
        raise RecipeError(f"{model}/{exc.file.relative_to(folder)}", FLAG, str(exc)) from None
