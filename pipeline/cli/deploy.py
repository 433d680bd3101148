"""Commands a serving team uses on published models: promote, pull, serve, export-triton.

A models:/ URI reaches this machine through `artifacts.registry.store.fetch` alone: "no such model" is bad
input (exit 2), a store that does not answer is the environment (exit 3).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.text import Text

from temper.artifacts.core.errors import EnvironmentProblem, RecipeError, first_line, unwritable
from temper.artifacts.triton.cluster import IMAGE, STORAGE_URI
from temper.pipeline.cli.common import TrackingOpt, app, err, folder_option, opens_sessions, out
from temper.pipeline.cli.deploy_options import (
    AllowClientShm,
    BurstFallbackMs,
    Control,
    ExportDest,
    ExportedModel,
    ExportInstances,
    ExportVersion,
    GrpcPort,
    Host,
    Image,
    Instances,
    Kind,
    LoadModel,
    Manifests,
    MaxBodyMb,
    MaxConnections,
    Port,
    Served,
    StorageUri,
    StrictReadiness,
)
from temper.pipeline.cli.serving import PULL_AGAIN

if TYPE_CHECKING:
    from temper.artifacts.formats.bundle import ServingConfig

@app.command()
def promote(
    name: Annotated[str, typer.Argument(help="registered model name")],
    version: Annotated[str, typer.Argument(help="version to point the alias at")],
    alias: Annotated[str, typer.Option("--alias", help="alias to move, e.g. champion")],
    tracking_uri: TrackingOpt = None,
) -> None:
    """Move an alias (e.g. champion) to a registered version."""
    from temper.artifacts.registry.store import StoreUnreachable, open_store

    try:  # a store that does not answer is the environment (3), not a wrong NAME (2)
        client = open_store(tracking_uri)
    except StoreUnreachable as exc:
        raise EnvironmentProblem(str(exc)) from exc
    steps = (("NAME", lambda: client.get_registered_model(name)),  # each error names the argument that is wrong
             ("VERSION", lambda: client.get_model_version(name, version)),
             ("--alias", lambda: client.set_registered_model_alias(name, alias, version)))
    for argument, step in steps:
        try:
            step()
        except Exception as exc:
            raise RecipeError(f"models:/{name}/{version}", argument, first_line(exc)) from exc
    out.print(f"models:/{name}@{alias} -> version {version}")


@app.command()
def pull(
    uri: Annotated[str, typer.Argument(help="models:/NAME@ALIAS or models:/NAME/VERSION")],
    dest: Annotated[Path, folder_option("--dest", help="folder to write the serving bundle into")],
    tracking_uri: TrackingOpt = None,
) -> None:
    """Download a registered version's serving bundle (model, runtime config, report, manifest) for deployment,
    after checking its model against the manifest. DIR must be new, empty or an earlier pull's."""
    from temper.artifacts.core.folders import MARKER

    with _fetched(uri, tracking_uri, "URI", dest) as (folder, name, version, tags, unchecked):
        _warn(unchecked)
        out.print(f"pulled {name} version {version} ({tags.get('precision', '?')}, candidate "
                  f"{tags.get('candidate', '?')}) into {folder}:")
        for item in sorted(folder.iterdir()):
            if item.name != MARKER:  # the marker that lets a later pull replace the folder
                out.print(f"  {item.name}  {item.stat().st_size:,} bytes")


@app.command()
@opens_sessions
def serve(
    model: Served,
    host: Host = "127.0.0.1",
    port: Port = 8000,
    max_body_mb: MaxBodyMb = None,
    max_connections: MaxConnections = None,
    grpc_port: GrpcPort = None,
    allow_client_shm: AllowClientShm = False,
    instances: Instances = None,
    control: Control = "none",
    load_model: LoadModel = None,
    strict_readiness: StrictReadiness = True,
    burst_fallback_ms: BurstFallbackMs = None,
    tracking_uri: TrackingOpt = None,
) -> None:
    """Serve a bundle, or a model repository of several, over the Open Inference Protocol (KServe v2 REST, and gRPC
    with --grpc-port): dynamic batching, model load and unload, Prometheus /metrics."""
    from temper.pipeline.cli import servers
    from temper.pipeline.cli.serving import checked_control, loaded_models

    checked_control(model, control, load_model or [])
    servers.show_worker_deaths()
    sock = servers.listen(model, host, port, grpc_port)
    with sock, loaded_models(model, tracking_uri, control, load_model or [], strict_readiness, instances,
                             _located, _warn, burst_fallback_ms) as (models, what):
        servers.run(model, models, what, sock, host, grpc_port, max_body_mb, max_connections, allow_client_shm)


@app.command("export-triton")
def export_triton(
    model: ExportedModel,
    dest: ExportDest,
    instances: ExportInstances = None,
    kind: Kind = "KIND_AUTO",
    image: Image = IMAGE,
    storage_uri: StorageUri = STORAGE_URI,
    manifests: Manifests = None,
    version: ExportVersion = None,
    tracking_uri: TrackingOpt = None,
) -> None:
    """Write a Triton model repository (config.pbtxt with dynamic batching and warm-up) for a model, and the
    Kubernetes Deployment, Service and KServe InferenceService that run it on a cluster."""
    from temper.pipeline.cli import exporting

    cluster, kube = exporting.checked(model, dest, manifests, image, storage_uri)
    with _located(model, tracking_uri) as (folder, config, unchecked, served):
        done = exporting.export(model, folder, config, served, dest, kube, cluster, instances, kind, version,
                                _vouching_output(folder, config))
    _warn(unchecked)  # once it is done: an error stays the one line it is
    exporting.show(done, dest, image, storage_uri)


def _warn(text: str | None) -> None:
    if text:
        err.print(Text.assemble(("warning: ", "yellow"), text), soft_wrap=True)


@contextmanager
def _fetched(uri: str, tracking: str | None, key: str, dest: Path | None = None
             ) -> Iterator[tuple[Path, str, str, dict[str, str], str | None]]:
    """(folder, name, version, version tags, why its model is unchecked or None) of a registered model's
    serving bundle, downloaded into `dest`, or into a temporary folder that goes when the block ends, and
    checked against its manifest. `key` names the argument."""
    from temper.artifacts.formats.integrity import Mismatch
    from temper.artifacts.registry.store import CannotWrite, FolderInUse, NoSuchModel, StoreUnreachable, fetch

    with tempfile.TemporaryDirectory(prefix="temper-bundle-") as tmp:
        try:
            got = fetch(uri, tracking, dest or Path(tmp) / "bundle")
        except StoreUnreachable as exc:
            raise EnvironmentProblem(str(exc)) from exc
        except NoSuchModel as exc:
            raise RecipeError(uri, key, str(exc)) from exc
        except FolderInUse as exc:
            raise RecipeError(str(dest), "--dest", str(exc)) from None
        except CannotWrite as exc:
            if dest is None:  # the temporary folder: the machine's, not an argument's
                raise EnvironmentProblem(f"cannot write the bundle into the temporary folder {tmp} "
                                         f"({exc.strerror}): free some space or set TMPDIR") from exc
            raise unwritable(dest, "--dest", exc, "the bundle") from exc
        except Mismatch as exc:  # the downloaded model is not the one its manifest records: not delivered
            raise RecipeError(str(exc.file), "", str(exc)) from None
        yield got.folder, got.name, got.version, got.tags, got.unchecked


def _checked(folder: Path, shown_as: str, remedy: str) -> str | None:
    """A bundle's model checked against the manifest it ships: a mismatch is one line naming the file
    (exit 2); for a bundle without a manifest (made by hand), the warning to show once it is used as it is."""
    from temper.artifacts.formats.integrity import Mismatch, check_bundle

    try:
        unchecked = check_bundle(folder, remedy)
    except Mismatch as exc:
        raise RecipeError(f"{shown_as}/{exc.file.relative_to(folder)}", "", str(exc)) from None
    return unchecked.replace(str(folder), shown_as) if unchecked else None


def _vouching_output(folder: Path, given: object) -> Path | None:
    """The run's output folder when `folder` is the model its report.json selected (servable checked it against
    the run's manifest already), so the export can carry both files; None otherwise."""
    from temper.artifacts.formats.integrity import MANIFEST, REPORT

    output = folder.parent
    if given is None or not (output / MANIFEST).is_file() or not (output / REPORT).is_file():
        return None
    try:
        selected = json.loads((output / REPORT).read_text()).get("selected")
    except (OSError, ValueError, AttributeError):
        return None
    return output if selected == folder.name else None


@contextmanager
def _located(model: str, tracking: str | None) -> Iterator[tuple[Path, ServingConfig | None, str | None, str]]:
    """What `temper serve MODEL` serves and `temper export-triton MODEL` exports: (model folder, its ServingConfig
    or None to read runtime.json, why its model is unchecked or None, the version it is: the registry's for a
    models:/ URI or a bundle `temper pull` wrote, else 1)."""
    from temper.artifacts.formats.integrity import Mismatch
    from temper.artifacts.formats.repository import DEFAULT_VERSION, registry_version
    from temper.pipeline.outputs import servable

    if model.startswith("models:/"):
        with _fetched(model, tracking, "MODEL") as (folder, _, version, _, unchecked):
            yield folder, None, unchecked, version
        return
    try:
        folder, config = servable(Path(model))
    except Mismatch as exc:  # a file of the run's output folder that is not the one its manifest records
        raise RecipeError(str(exc.file), "", str(exc)) from None
    except ValueError as exc:
        raise RecipeError(model, "MODEL", str(exc)) from None
    version = (registry_version(folder) if config is None else None) or DEFAULT_VERSION
    yield folder, config, _checked(folder, model.rstrip("/"), PULL_AGAIN) if config is None else None, version
