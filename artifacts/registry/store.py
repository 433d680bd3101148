"""Publish a gated run to MLflow: one run with params, metrics and every artifact; the selected
candidate's serving bundle as a pyfunc model; then, last, a registered version and its alias.

Registering last means a failure or Ctrl-C part-way leaves a run but never a version that
points at half-logged artifacts. The same model bytes from the same recipe reuse their version.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sqlite3
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import mlflow
from mlflow.entities.model_registry import ModelVersion
from mlflow.tracking import MlflowClient

from temper.artifacts.core.folders import (
    MARKER,
    RUN_OUTPUT,
    WRITERS,
    claim,
    copy_into,
    discard,
    mark,
    owned_above,
    owner,
    replaceable,
    require_writable,
    swap_in,
    sweep,
)
from temper.artifacts.formats.bundle import CONFIG
from temper.artifacts.formats.integrity import Mismatch, check_bundle

DEFAULT_DB = "mlflow.db"
DEFAULT_ARTIFACTS = "mlartifacts"
PARAM_LIMIT = 6000  # MLflow's longest param value
DAMAGED = "the registry's copy was changed after publishing: publish it again with `temper run`"


def tracking_uri(flag: str | None) -> str:
    """--tracking-uri, else MLFLOW_TRACKING_URI, else an embedded sqlite store in the working folder."""
    return flag or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path(DEFAULT_DB).resolve()}"


def connect(flag: str | None) -> MlflowClient:
    uri = tracking_uri(flag)
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    return MlflowClient(uri, uri)


def open_store(flag: str | None) -> MlflowClient:
    """A client of the store that answers now, or StoreUnreachable at once: every command that reads or
    writes the registry opens it here. MLflow retries an sqlite file it cannot open for about 100 s
    (create_sqlalchemy_engine_with_retry) and its client opens the store as it is built, so a folder, a
    file that is not a database or a path under a file is found by opening it first, directly."""
    uri = tracking_uri(flag)
    try:
        _probe_sqlite(uri)
        client = connect(flag)
        reachable(client)
    except Exception as exc:  # refused, unknown host, timeout, a store file or folder it cannot open
        raise StoreUnreachable(f"the MLflow store {uri} does not answer ({_first_line(exc)}): "
                               "start it, or pass --tracking-uri") from exc
    return client


def _probe_sqlite(uri: str) -> None:
    """Raise unless the sqlite file `uri` names can be opened, or created where it is missing."""
    if not uri.startswith("sqlite:///"):
        return
    path = Path(uri.removeprefix("sqlite:///").split("?", 1)[0])
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a folder, not an sqlite database file")
    if path.exists():
        with contextlib.closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=5)) as db:
            db.execute("SELECT count(*) FROM sqlite_master").fetchone()  # "file is not a database", unreadable
        return
    above = next(p for p in path.absolute().parents if p.exists())  # MLflow creates the folders below it
    if not above.is_dir() or not os.access(above, os.W_OK | os.X_OK):
        raise NotADirectoryError(f"{path} cannot be created: {above} is not a writable folder")


def reachable(client: MlflowClient) -> None:
    """Raise unless the store answers now: one request, a short timeout, no retries (MLflow's
    default retry policy takes minutes to give up on a server that is not there)."""
    saved = {k: os.environ.get(k) for k in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT")}
    os.environ.update(MLFLOW_HTTP_REQUEST_MAX_RETRIES="0", MLFLOW_HTTP_REQUEST_TIMEOUT="10")
    try:
        client.search_experiments(max_results=1)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value

GENAI_CONFIG = "genai_config.json"  # a decoder's model builder folder


@dataclass(frozen=True)
class Published:
    name: str
    version: str
    alias: str
    run_id: str
    reused: bool
    uri: str


def record_run(
    client: MlflowClient,
    *,
    experiment: str,
    run_name: str,
    params: dict[str, Any],
    metrics: dict[str, float],
    output_folder: Path,
    tags: dict[str, str],
    bundle: Path | None,
    decoder: Path | None = None,
) -> tuple[str, str | None]:
    """One MLflow run per temper run, gates passed or not; the serving bundle (or a decoder's model builder
    folder) is logged as a pyfunc model only when there is one to ship. Returns (run id, model URI or None)."""
    from temper.artifacts.registry.decoder_pyfunc import log_decoder
    from temper.artifacts.registry.pyfunc import log_bundle

    with mlflow.start_run(experiment_id=_experiment(client, experiment), run_name=run_name) as run:
        mlflow.log_params({_key(k): _value(v) for k, v in params.items()})
        mlflow.log_metrics({_key(k): float(v) for k, v in metrics.items()})
        mlflow.set_tags({f"temper.{k}": v for k, v in tags.items()})
        mlflow.log_artifacts(str(output_folder), artifact_path="output")
        model_uri = log_bundle(bundle, name="model").model_uri if bundle is not None else None
        if decoder is not None:
            model_uri = log_decoder(decoder, name="model").model_uri
    return run.info.run_id, model_uri


def register(client: MlflowClient, *, name: str, alias: str, run_id: str, model_uri: str,
             tags: dict[str, str]) -> Published:
    """Register the logged model (or reuse the version holding the same model and recipe) and move the alias.
    Called only after every artifact is logged, so an interruption never leaves a half-made version."""
    existing = _same_version(client, name, tags["model_sha256"], tags["recipe_sha256"])
    if existing is not None:
        client.set_registered_model_alias(name, alias, existing)
        return Published(name, existing, alias, run_id, True, f"models:/{name}@{alias}")
    with _events_follow_log_level():
        version = mlflow.register_model(model_uri, name, tags=tags)
    client.set_registered_model_alias(name, alias, version.version)
    return Published(name, str(version.version), alias, run_id, False, f"models:/{name}@{alias}")


def _events_follow_log_level() -> contextlib.AbstractContextManager[object]:
    """MLflow prints event lines ("Successfully registered model ...") straight to stderr whatever its log
    level; they show only when its loggers show INFO (temper --debug, or MLFLOW_LOGGING_LEVEL=INFO)."""
    if logging.getLogger("mlflow").isEnabledFor(logging.INFO):
        return contextlib.nullcontext()
    return contextlib.redirect_stderr(io.StringIO())


def _experiment(client: MlflowClient, name: str) -> str:
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    location = None
    if client.tracking_uri.startswith("sqlite:///"):  # keep artifacts beside the embedded store, absolute
        location = (Path(client.tracking_uri.removeprefix("sqlite:///")).parent / DEFAULT_ARTIFACTS).resolve().as_uri()
    return client.create_experiment(name, artifact_location=location)


def _same_version(client: MlflowClient, name: str, model_sha: str, recipe_sha: str) -> str | None:
    try:
        versions = client.search_model_versions(f"name='{name}'")
    except mlflow.exceptions.MlflowException:
        return None
    for version in versions:
        if version.tags.get("model_sha256") == model_sha and version.tags.get("recipe_sha256") == recipe_sha:
            return str(version.version)
    return None


def _key(key: str) -> str:
    """MLflow keys allow letters, digits, _ - . space : / only."""
    return "".join(c if c.isalnum() or c in "_-. :/" else "_" for c in key)[:250]


def _value(value: Any) -> str:
    text = str(value)
    return text if len(text) <= PARAM_LIMIT else text[: PARAM_LIMIT - 3] + "..."


class StoreUnreachable(ConnectionError):
    """The MLflow store did not answer: an environment problem, not a wrong name."""


class NoSuchModel(LookupError):
    """The store answered, but holds no such name, alias or version, or no temper bundle in it."""


class FolderInUse(FileExistsError):
    """The destination holds files temper did not put there, or is a file: a download would overwrite them."""


class CannotWrite(OSError):
    """The destination cannot be written: a file in the way, a read-only folder, a full disk (errno says which).
    Raised before anything is downloaded where that can be known, and never with a half-written destination."""


@dataclass(frozen=True)
class Fetched:
    name: str
    version: str
    folder: Path
    tags: dict[str, str]
    run_id: str = ""
    unchecked: str | None = None  # why the bundle's model could not be checked (it has no manifest), to warn

    @property
    def uri(self) -> str:
        return f"models:/{self.name}/{self.version}"


def version_tags(uri: str, tracking: str | None) -> dict[str, str]:
    """The tags of the version a models:/ URI names (what `temper serve` reads to tell a decoder from a bundle),
    without downloading it; StoreUnreachable, NoSuchModel."""
    client = open_store(tracking)
    try:
        return dict(_resolve_version(client, uri).tags)
    except (ValueError, mlflow.exceptions.MlflowException) as exc:
        raise NoSuchModel(_first_line(exc)) from exc


def fetch(uri: str, tracking: str | None, dest: Path) -> Fetched:
    """The one way a registered model reaches this machine (`pull`, `serve`, `export-triton`): check `dest`
    is temper's to fill (FolderInUse) and the store answers (StoreUnreachable), resolve models:/NAME@ALIAS or
    models:/NAME/VERSION and download its serving bundle into `dest` (NoSuchModel for a malformed URI, an
    unknown name/alias/version, or a version that holds no bundle)."""
    unchecked: list[str] = []

    def bundle_of(found: ModelVersion, tmp: str) -> Path:
        uri = f"models:/{found.name}/{found.version}"
        local = Path(mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=tmp))
        found_configs = sorted(local.rglob(CONFIG), key=lambda p: len(p.parts))  # the bundle's, not its backup/'s
        folder = found_configs[0].parent if found_configs else None
        if folder is None:  # a decoder LLM: its model builder folder (genai_config.json), which `temper serve` serves
            decoder = next((p.parent for p in local.rglob(GENAI_CONFIG)), None)
            if decoder is not None:
                return decoder
            raise FileNotFoundError(f"{uri} holds no temper serving bundle ({CONFIG} not found)")
        try:  # before it reaches `dest`: a damaged copy is never delivered
            warning = check_bundle(folder, DAMAGED)
        except Mismatch as exc:
            raise Mismatch(Path(uri) / exc.file.relative_to(folder), str(exc)) from None
        unchecked.extend([warning.replace(str(folder), uri)] if warning else [])
        return folder

    got = _fetch(uri, tracking, dest, bundle_of)
    return replace(got, unchecked=unchecked[0] if unchecked else None)


def fetch_output(uri: str, tracking: str | None, dest: Path) -> Fetched:
    """A registered version's whole output folder as its `temper run` logged it (every model, the manifest
    and the reports: what `temper validate --model` re-gates), with fetch's checks and errors."""
    def output_of(found: ModelVersion, tmp: str) -> Path:
        if not found.run_id:
            raise FileNotFoundError(f"models:/{found.name}/{found.version} names no MLflow run to take its output from")
        local = Path(mlflow.artifacts.download_artifacts(run_id=found.run_id, artifact_path="output", dst_path=tmp))
        if not (local / "manifest.json").is_file():
            raise FileNotFoundError(f"the run of models:/{found.name}/{found.version} logged no temper output folder "
                                    "(output/manifest.json)")
        return local

    return _fetch(uri, tracking, dest, output_of, RUN_OUTPUT)


def _fetch(uri: str, tracking: str | None, dest: Path, download: Callable[[ModelVersion, str], Path],
           holds: str | None = None) -> Fetched:
    """`holds`: None for a bundle (`dest` new, empty or an earlier pull's), else what the marker records `dest`
    holds (`dest` new, empty or any folder temper wrote, as `temper validate --output` takes)."""
    if dest.exists() and not dest.is_dir():
        raise FolderInUse(f"{dest} is a file, not a folder: choose a new or empty folder")
    if not replaceable(dest):
        raise FolderInUse(f"{dest} is not empty and temper did not download into it (no {MARKER} marker): "
                          "its files would be overwritten; choose a new or empty folder, or delete it")
    if holds is None and not replaceable(dest, only="pull"):  # a folder another command owns
        raise FolderInUse(f"{dest} was written by {WRITERS[owner(dest) or 'temper']}, not an earlier `temper pull`: "
                          "a pull would replace it whole; choose a new or empty folder")
    if (above := owned_above(dest)) is not None:  # lost when the command that owns that folder replaces it
        raise FolderInUse(f"{dest} lies in {above[0]}, which {WRITERS[above[1]]} wrote and may replace whole: "
                          "choose a folder outside it")
    client = open_store(tracking)
    dest = dest.resolve()
    try:
        found = _resolve_version(client, uri)
    except (ValueError, mlflow.exceptions.MlflowException) as exc:
        raise NoSuchModel(_first_line(exc)) from exc
    staging = _staging(dest)  # before the download: a destination that cannot be written fails at once
    try:
        with tempfile.TemporaryDirectory() as tmp:
            try:
                source = download(found, tmp)
            except Mismatch:  # a ValueError too: the copy is damaged, not missing
                raise
            except (ValueError, FileNotFoundError, mlflow.exceptions.MlflowException) as exc:
                raise NoSuchModel(_first_line(exc)) from exc
            _deliver(source, staging, dest, f"models:/{found.name}/{found.version}", holds)
    finally:
        discard(staging)
    return Fetched(found.name, str(found.version), dest, dict(found.tags), found.run_id or "")


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def _resolve_version(client: MlflowClient, uri: str) -> ModelVersion:
    """The registered version models:/NAME@ALIAS or models:/NAME/VERSION names."""
    if not uri.startswith("models:/"):
        raise ValueError(f"'{uri}' is not a models:/NAME@ALIAS or models:/NAME/VERSION URI")
    ref = uri.removeprefix("models:/")
    if "@" in ref:
        name, alias = ref.split("@", 1)
        return client.get_model_version_by_alias(name, alias)
    name, _, version = ref.partition("/")
    return client.get_model_version(name, version)


def _staging(dest: Path) -> Path:
    """A new staging folder beside `dest` (dead runs' ones swept), or CannotWrite."""
    prefix = f".{dest.name}.partial-"
    try:
        require_writable(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        sweep(dest.parent, prefix)
        return claim(dest.parent, prefix)
    except OSError as exc:
        raise CannotWrite(exc.errno, exc.strerror, exc.filename) from exc


def _deliver(source: Path, staging: Path, dest: Path, uri: str, holds: str | None) -> None:
    """Copy `source` into `staging`, mark it as temper's and swap it in place of `dest` whole: no file of an
    earlier download lingers beside the new ones, and a failed or interrupted copy leaves `dest` as it was."""
    try:
        copy_into(source, staging)
        (staging / MARKER).unlink(missing_ok=True)  # a logged output folder's own marker: replaced by this one
        mark(staging, pulled=uri, **({"holds": holds} if holds else {}))
        swap_in(staging, dest)
    except OSError as exc:
        raise CannotWrite(exc.errno, exc.strerror, exc.filename) from exc
