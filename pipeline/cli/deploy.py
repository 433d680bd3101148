"""Commands a serving team uses on published models: promote, pull, serve, export-triton.

A models:/ URI reaches this machine through `artifacts.registry.fetch` alone: "no such model" is bad
input (exit 2), a store that does not answer is the environment (exit 3).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.text import Text

from temper.pipeline.cli.common import TrackingOpt, app, err, out
from temper.pipeline.errors import EnvironmentProblem, RecipeError, first_line

if TYPE_CHECKING:
    from temper.artifacts.bundle import ServingConfig

PULL_AGAIN = "pull it again with `temper pull`, or rebuild it with `temper run`"


@app.command()
def promote(
    name: Annotated[str, typer.Argument(help="registered model name")],
    version: Annotated[str, typer.Argument(help="version to point the alias at")],
    alias: Annotated[str, typer.Option("--alias", help="alias to move, e.g. champion")],
    tracking_uri: TrackingOpt = None,
) -> None:
    """Move an alias (e.g. champion) to a registered version."""
    from temper.artifacts.registry import connect, reachable
    from temper.artifacts.registry import tracking_uri as resolved

    client = connect(tracking_uri)
    try:  # a store that does not answer is the environment (3), not a wrong NAME (2)
        reachable(client)
    except Exception as exc:
        raise EnvironmentProblem(f"the MLflow store {resolved(tracking_uri)} does not answer ({first_line(exc)}): "
                                 "start it, or pass --tracking-uri") from exc
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
    dest: Annotated[Path, typer.Option("--dest", help="folder to write the serving bundle into")],
    tracking_uri: TrackingOpt = None,
) -> None:
    """Download a registered version's serving bundle (model, runtime config, report, manifest) for deployment,
    after checking its model against the manifest. DIR must be new, empty or an earlier pull's."""
    from temper.artifacts.folders import MARKER

    with _fetched(uri, tracking_uri, "URI", dest) as (folder, name, version, tags, unchecked):
        _warn(unchecked)
        out.print(f"pulled {name} version {version} ({tags.get('precision', '?')}, candidate "
                  f"{tags.get('candidate', '?')}) into {folder}:")
        for item in sorted(folder.iterdir()):
            if item.name != MARKER:  # the marker that lets a later pull replace the folder
                out.print(f"  {item.name}  {item.stat().st_size:,} bytes")


@app.command()
def serve(
    model: Annotated[str, typer.Argument(
        help="serving bundle folder; a run's output folder (its selected model) or OUTPUT/CANDIDATE; "
             "or models:/NAME@ALIAS or models:/NAME/VERSION", show_default=False)],
    host: Annotated[str, typer.Option(
        "--host", help="address to bind; 0.0.0.0 exposes the server beyond this machine")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="TCP port")] = 8000,
    max_body_mb: Annotated[float | None, typer.Option(
        "--max-body-mb", help="refuse larger request bodies with HTTP 413 [default: a full batch of the model's "
                              "inputs as JSON, at least 1 MiB]")] = None,
    max_connections: Annotated[int | None, typer.Option(
        "--max-connections", min=1, help="open HTTP connections at most; one more closes the longest idle one "
                                         "[default: what the open-file limit leaves room for, at most 4096]")] = None,
    grpc_port: Annotated[int | None, typer.Option(
        "--grpc-port", min=1, max=65535, help="also serve KServe v2 gRPC on this port (needs the grpc extra)")] = None,
    tracking_uri: TrackingOpt = None,
) -> None:
    """Serve a bundle over the Open Inference Protocol (KServe v2 REST, and gRPC with --grpc-port): dynamic batching,
    Prometheus /metrics."""
    from temper.artifacts.runtime import Runtime
    from temper.artifacts.server import bind, body_limit
    from temper.artifacts.server import serve as run_server

    if max_body_mb is not None and max_body_mb <= 0:
        raise RecipeError(model, "--max-body-mb", f"must be more than 0, got {max_body_mb}")
    if grpc_port is not None:  # before any loading: missing packages are known now
        if grpc_port == port:
            raise RecipeError(model, "--grpc-port", f"must differ from --port {port}")
        try:
            from temper.artifacts.grpc_server import GrpcServer
        except ImportError as exc:
            raise EnvironmentProblem(f"--grpc-port: {first_line(exc)}") from None
    try:  # before loading or printing anything: a busy port is one line, not a traceback
        sock = bind(host, port)
    except OSError as exc:
        raise EnvironmentProblem(f"--port: cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    with sock, _located(model, tracking_uri) as (folder, config, unchecked):
        try:
            runtime = Runtime(folder, config=config)
        except Exception as exc:  # an invalid runtime.json, a model onnxruntime cannot load
            raise RecipeError(model, "MODEL", f"cannot load the bundle: {first_line(exc)}") from exc
        for warning in (unchecked, runtime.host_warning, runtime.drift_warning):
            _warn(warning)  # the root logger is at ERROR without --debug: the log line alone goes unseen
        name = runtime.config.name
        max_body = int(max_body_mb * 1024 * 1024) if max_body_mb else body_limit(runtime.config)
        out.print(f"serving {name} ({runtime.engine}) at http://{host}:{sock.getsockname()[1]}/v2/models/{name} "
                  "once warm (GET /v2/health/ready answers 200); Ctrl-C stops", soft_wrap=True)
        grpc_server = None
        if grpc_port is not None:  # shares the runtime: ModelInfer answers UNAVAILABLE until the warm-up is done
            grpc_server = GrpcServer(runtime, host, grpc_port, max_body)
            try:
                grpc_server.start()
            except OSError as exc:
                raise EnvironmentProblem(f"--grpc-port: {exc}") from None
            out.print(f"serving {name} over gRPC (KServe v2 GRPCInferenceService) at {host}:{grpc_port}",
                      soft_wrap=True)
        try:
            run_server(runtime, sock, max_body, max_connections)
        finally:
            if grpc_server is not None:
                grpc_server.stop()


@app.command("export-triton")
def export_triton(
    model: Annotated[str, typer.Argument(help="a serving bundle folder or models:/NAME@ALIAS")],
    dest: Annotated[Path, typer.Option("--dest", help="Triton model repository to write into")],
    instances: Annotated[int, typer.Option("--instances", min=1, help="model instances per device")] = 1,
    kind: Annotated[str, typer.Option("--kind", help="KIND_AUTO, KIND_GPU or KIND_CPU")] = "KIND_AUTO",
    tracking_uri: TrackingOpt = None,
) -> None:
    """Write a Triton model repository (config.pbtxt with dynamic batching and warm-up) for a published model."""
    from temper.artifacts.bundle import read
    from temper.artifacts.triton import export_repository, no_batching

    with _bundle(model, tracking_uri) as (folder, unchecked):
        try:
            written = export_repository(folder, dest, instances=instances, kind=kind)
        except Exception as exc:  # not a bundle, a bad --kind, a foreign folder in the way
            raise RecipeError(model, "MODEL", first_line(exc)) from exc
        unbatched = no_batching(read(folder))
    _warn(unchecked)  # once it is done: an error stays the one line it is
    _warn(unbatched)
    out.print(f"wrote Triton model {written.name} to {dest}:")
    for item in sorted(written.rglob("*")):
        if item.is_file():
            out.print(f"  {item.relative_to(dest)}  {item.stat().st_size:,} bytes")


def _warn(text: str | None) -> None:
    if text:
        err.print(Text.assemble(("warning: ", "yellow"), text), soft_wrap=True)


@contextmanager
def _fetched(uri: str, tracking: str | None, key: str, dest: Path | None = None
             ) -> Iterator[tuple[Path, str, str, dict[str, str], str | None]]:
    """(folder, name, version, version tags, why its model is unchecked or None) of a registered model's
    serving bundle, downloaded into `dest`, or into a temporary folder that goes when the block ends, and
    checked against its manifest. `key` names the argument."""
    from temper.artifacts.integrity import Mismatch
    from temper.artifacts.registry import FolderInUse, NoSuchModel, StoreUnreachable, fetch

    with tempfile.TemporaryDirectory(prefix="temper-bundle-") as tmp:
        try:
            got = fetch(uri, tracking, dest or Path(tmp) / "bundle")
        except StoreUnreachable as exc:
            raise EnvironmentProblem(str(exc)) from exc
        except NoSuchModel as exc:
            raise RecipeError(uri, key, str(exc)) from exc
        except FolderInUse as exc:
            raise RecipeError(str(dest), "--dest", str(exc)) from None
        except Mismatch as exc:  # the downloaded model is not the one its manifest records: not delivered
            raise RecipeError(str(exc.file), "", str(exc)) from None
        yield got.folder, got.name, got.version, got.tags, got.unchecked


def _checked(folder: Path, shown_as: str, remedy: str) -> str | None:
    """A bundle's model checked against the manifest it ships: a mismatch is one line naming the file
    (exit 2); for a bundle without a manifest (made by hand), the warning to show once it is used as it is."""
    from temper.artifacts.integrity import Mismatch, check_bundle

    try:
        unchecked = check_bundle(folder, remedy)
    except Mismatch as exc:
        raise RecipeError(f"{shown_as}/{exc.file.relative_to(folder)}", "", str(exc)) from None
    return unchecked.replace(str(folder), shown_as) if unchecked else None


@contextmanager
def _bundle(model: str, tracking: str | None) -> Iterator[tuple[Path, str | None]]:
    """A bundle folder as given (checked against its manifest), or a models:/ URI's bundle fetched for the
    block's length; and why its model is unchecked, or None."""
    from temper.artifacts.bundle import CONFIG

    if not model.startswith("models:/"):
        unchecked = _checked(Path(model), model.rstrip("/"), PULL_AGAIN) if (Path(model) / CONFIG).is_file() else None
        yield Path(model), unchecked
        return
    with _fetched(model, tracking, "MODEL") as (folder, *_, unchecked):
        yield folder, unchecked


@contextmanager
def _located(model: str, tracking: str | None) -> Iterator[tuple[Path, ServingConfig | None, str | None]]:
    """What `temper serve MODEL` serves: (model folder, its ServingConfig or None to read runtime.json, why its
    model is unchecked or None)."""
    from temper.artifacts.integrity import Mismatch
    from temper.pipeline.outputs import servable

    if model.startswith("models:/"):
        with _fetched(model, tracking, "MODEL") as (folder, *_, unchecked):
            yield folder, None, unchecked
        return
    try:
        folder, config = servable(Path(model))
    except Mismatch as exc:  # a file of the run's output folder that is not the one its manifest records
        raise RecipeError(str(exc.file), "", str(exc)) from None
    except ValueError as exc:
        raise RecipeError(model, "MODEL", str(exc)) from None
    yield folder, config, _checked(folder, model.rstrip("/"), PULL_AGAIN) if config is None else None
