"""Where `temper serve` finds the models it may load: one bundle, or a model repository of several.

A model repository is the layout `temper export-triton` writes (and Triton reads), each numbered version
folder a complete temper bundle beside the files Triton uses:

    <repository>/
      <model>/
        config.pbtxt      Triton's; temper serve does not read it
        1/  model.onnx runtime.json [manifest.json report.json]
        3/  ...
      <ensemble>/
        config.pbtxt      Triton's, `platform: "ensemble"`: read (artifacts/formats/ensemble.py), its steps checked
        1/                empty: the version of the ensemble

Versions follow Triton's rules: a version folder is named by a positive number without a leading 0
(`0`, `01`, `latest` are ignored), and the highest one is served (Triton's default version policy,
latest 1). A model's name is its folder's, as Triton names it. Imports nothing from pipeline/.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from temper.artifacts.core.folders import MARKER
from temper.artifacts.formats import ensemble
from temper.artifacts.formats.bundle import CONFIG, MODEL, ServingConfig, read
from temper.artifacts.formats.ensemble import EnsembleError, EnsembleSpec, SchemaMissing

VERSION_FOLDER = re.compile(r"[1-9][0-9]*")
DEFAULT_VERSION = "1"  # what a bundle with no registry version answers: a run's output, a hand-made bundle


class ModelNotServed(LookupError):
    """A request for a model (or version) this server does not serve now: 404 / NOT_FOUND."""


class LoadFailed(ValueError):
    """A load that did not happen: no such model in the repository, or its bundle cannot be served."""


class NeedsSchema(LoadFailed):
    """An ensemble's config.pbtxt cannot be read without Triton's ModelConfig schema (the grpc extra)."""


@dataclass(frozen=True)
class Source:
    """One servable version of a model: its folder, and the config to serve it with (None: its runtime.json); an
    ensemble's also its checked steps (artifacts/formats/ensemble.py), and its config is the ensemble's tensors."""

    name: str
    version: str
    folder: Path
    config: ServingConfig | None = None
    ensemble: EnsembleSpec | None = None

    def serving_config(self) -> ServingConfig:
        """The config, named as the model is served (a repository names a model by its folder, as Triton does)."""
        config = self.config or read(self.folder)
        return config if config.name == self.name else config.model_copy(update={"name": self.name})


class Catalog(Protocol):
    """What a server can load: the names it knows, and the version of one to serve now."""

    def names(self) -> list[str]: ...

    def locate(self, name: str) -> Source: ...


class OneBundle:
    """The catalog of `temper serve BUNDLE`: one model, one version."""

    def __init__(self, source: Source) -> None:
        self.source = source

    def names(self) -> list[str]:
        return [self.source.name]

    def locate(self, name: str) -> Source:
        if name != self.source.name:
            raise LoadFailed(f"no model '{name}' here: this server serves the bundle of '{self.source.name}'")
        return self.source


class ModelRepository:
    """A folder of models, each with numbered version folders holding temper bundles; read on each call, so a
    version copied in later is what the next load serves."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    @staticmethod
    def recognizes(path: Path) -> bool:
        """Whether `path` is laid out as a repository: no runtime.json (a bundle) or manifest.json (a run's output)
        of its own, and a model folder with a numbered version folder. One exported before version folders were
        bundles is recognized too, so that its load says to export it again."""
        if not path.is_dir() or (path / CONFIG).exists() or (path / "manifest.json").exists():
            return False
        return any(_versions(model) for model in _model_folders(path))

    def names(self) -> list[str]:
        return [folder.name for folder in _model_folders(self.root)]

    def versions(self, name: str) -> list[str]:
        """The model's version folders, lowest first (Triton's numbering; other folders ignored)."""
        return _versions(self.root / name)

    def locate(self, name: str, within: tuple[str, ...] = ()) -> Source:
        """The version to serve: the highest numbered folder. LoadFailed when there is none, or it holds no bundle
        (or, for an ensemble, its steps do not fit its composing models; `within`: the ensembles being checked
        that name this one, a cycle when it is among them)."""
        if name not in self.names():
            raise LoadFailed(f"no model '{name}' in the repository {self.root} (it has: "
                             f"{', '.join(self.names()) or 'none'})")
        versions = self.versions(name)
        if not versions:
            raise LoadFailed(f"{self.root / name} has no numbered version folder (1/, 2/, ...) holding a bundle")
        folder = self.root / name / versions[-1]
        if ensemble.declares(self.root / name):
            return self._ensemble(name, versions[-1], folder, within)
        if not (folder / MODEL).is_file() or not (folder / CONFIG).is_file():
            raise LoadFailed(f"{folder} is not a temper serving bundle (needs {MODEL} and {CONFIG}): export it "
                             "again with `temper export-triton`")
        return Source(name, versions[-1], folder)

    def _ensemble(self, name: str, version: str, folder: Path, within: tuple[str, ...]) -> Source:
        """An ensemble's Source, checked against the Sources of the models its steps name."""
        try:
            spec = ensemble.parse(self.root / name, name)
            composing = {}
            for model in spec.models:
                if model in (*within, name):
                    raise EnsembleError(f"ensemble '{name}' runs '{model}', which runs '{name}' (a cycle)")
                if model in self.names():
                    source = self.locate(model, (*within, name))
                    composing[model] = (source.version, source.serving_config())
            spec = ensemble.check(spec, composing)
        except NeedsSchema:
            raise
        except SchemaMissing as exc:
            raise NeedsSchema(str(exc)) from exc
        except (EnsembleError, OSError, ValueError) as exc:
            raise LoadFailed(str(exc) if isinstance(exc, EnsembleError | LoadFailed)
                             else f"{folder}: {exc}") from exc
        return Source(name, version, folder, spec.config, spec)


def _model_folders(root: Path) -> list[Path]:
    """The model folders of a repository, by name; hidden ones (a staging `.name.partial`) are not models."""
    try:
        return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    except OSError:
        return []


def _versions(model: Path) -> list[str]:
    try:
        found = [p.name for p in model.iterdir() if p.is_dir() and VERSION_FOLDER.fullmatch(p.name)]
    except OSError:
        return []
    return sorted(found, key=int)


def registry_version(folder: Path) -> str | None:
    """The registry version a bundle folder came from (`temper pull` records models:/NAME/VERSION in its marker),
    or None for a folder that did not come from the registry."""
    try:
        about = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return None
    pulled = about.get("pulled") if isinstance(about, dict) else None
    if not isinstance(pulled, str) or not pulled.startswith("models:/"):
        return None
    version = pulled.rpartition("/")[2]
    return version if VERSION_FOLDER.fullmatch(version) else None
