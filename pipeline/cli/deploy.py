"""Commands a serving team uses on published models: promote, pull, serve, export-triton.

A models:/ URI reaches this machine through `artifacts.registry.store.fetch` alone: "no such model" is bad
input (exit 2), a store that does not answer is the environment (exit 3).
"""

from __future__ import annotations

import json
import logging
import socket
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.text import Text

from temper.artifacts.core.errors import EnvironmentProblem, RecipeError, first_line, unwritable
from temper.artifacts.triton.cluster import IMAGE, STORAGE_URI
from temper.pipeline.cli.common import TrackingOpt, app, err, folder_option, number, opens_sessions, out
from temper.pipeline.cli.destinations import apart, beside, can_hold, unowned
from temper.pipeline.cli.serving import PULL_AGAIN

if TYPE_CHECKING:
    from temper.artifacts.formats.bundle import ServingConfig

MAX_BODY_MB = 2047  # gRPC's message limit is a C int (2 GiB less a byte); a REST body that size is a typo too


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
    model: Annotated[str, typer.Argument(
        help="serving bundle folder; a run's output folder (its selected model) or OUTPUT/CANDIDATE; "
             "models:/NAME@ALIAS or models:/NAME/VERSION; or a model repository (what export-triton writes: "
             "MODEL/VERSION/ bundle folders, the highest version of each served)", show_default=False)],
    host: Annotated[str, typer.Option(
        "--host", help="address to bind; 0.0.0.0 exposes the server beyond this machine")] = "127.0.0.1",
    port: Annotated[int, number("--port", "TCP port; 0: one the system picks", 0, 65535)] = 8000,
    max_body_mb: Annotated[float | None, number(
        "--max-body-mb", "refuse larger request bodies with HTTP 413; default: a full batch of the model's inputs as "
                         "JSON, at least 1 MiB", 0.001, MAX_BODY_MB)] = None,
    max_connections: Annotated[int | None, number(
        "--max-connections", "open HTTP connections at most; one more closes the longest idle one; default: what the "
                             "open-file limit leaves room for, at most 4096", 1)] = None,
    grpc_port: Annotated[int | None, number(
        "--grpc-port", "also serve KServe v2 gRPC on this port (needs the grpc extra)", 1, 65535)] = None,
    allow_client_shm: Annotated[bool, typer.Option(
        "--allow-client-shm", help="let local clients register system shared memory regions (Triton's extension) "
                                   "for inputs and outputs; anyone who can reach the port can then make the server "
                                   "read and write the shared memory they name")] = False,
    instances: Annotated[int | None, number(
        "--instances", "worker processes running the model (Triton's instance_group count), each isolated: a crash "
                       "in one is restarted and fails only the batch it ran; 0: in the server's own process; "
                       "default: usable cores over the model's intra-op threads (1 on a GPU), 0 for a model that runs "
                       "inline (faster than the hand-off to a worker)", 0, 64)] = None,
    control: Annotated[str, typer.Option(
        "--model-control-mode", help="none: every model of a repository is loaded at start and load/unload are "
                                     "refused; explicit: only the --load-model ones, the others through the "
                                     "repository load API (Triton's modes)")] = "none",
    load_model: Annotated[list[str] | None, typer.Option(
        "--load-model", help="a model to load at start with --model-control-mode explicit; repeatable; '*': all",
        show_default=False)] = None,
    strict_readiness: Annotated[bool, typer.Option(
        "--strict-readiness/--no-strict-readiness",
        help="/v2/health/ready answers 200 only once every model asked for is loaded and warmed up; off: once the "
             "server is up")] = True,
    burst_fallback_ms: Annotated[float | None, number(
        "--burst-fallback-ms", "latency target of the burst fallback (off by default): requests go to the bundle's "
                               "backup model (its backup/ folder; a run's output folder: the fastest other pair that "
                               "passed every gate) while the primary's queue would make them wait longer, and back "
                               "once it is under half of it", 0.001)] = None,
    tracking_uri: TrackingOpt = None,
) -> None:
    """Serve a bundle, or a model repository of several, over the Open Inference Protocol (KServe v2 REST, and gRPC
    with --grpc-port): dynamic batching, model load and unload, Prometheus /metrics."""
    from temper.artifacts.formats.repository import LoadFailed
    from temper.artifacts.serving.client_shm import ClientRegions
    from temper.artifacts.serving.http_limits import MIN_BODY_BYTES, body_limit
    from temper.artifacts.serving.server import bind
    from temper.artifacts.serving.server import serve as run_server
    from temper.pipeline.cli.serving import checked_control, loaded_models

    checked_control(model, control, load_model or [])
    # an operator sees each worker death (with its signal) and each instance taken out, which the root
    # logger's ERROR level would drop; --debug shows everything already
    deaths = logging.getLogger("temper.serving.workers")
    deaths.setLevel(min(logging.getLogger().getEffectiveLevel(), logging.WARNING))
    if not logging.getLogger().handlers and not deaths.handlers:
        deaths.addHandler(logging.StreamHandler())  # one line each on stderr, as the message says it
    if grpc_port is not None:  # before any loading: missing packages are known now
        if grpc_port == port:
            raise RecipeError(model, "--grpc-port", f"must differ from --port {port}")
        try:
            from temper.artifacts.serving.grpc_server import GrpcServer
        except ImportError as exc:
            raise EnvironmentProblem(f"--grpc-port: {first_line(exc)}") from None
    try:  # before loading or printing anything: a busy port is one line, not a traceback
        sock = bind(host, port)
    except socket.gaierror as exc:  # not an address: the flag is wrong, not the host
        raise RecipeError(model, "--host", f"{host!r} is not an address to listen on: {exc.strerror or exc}") \
            from None
    except OSError as exc:
        raise EnvironmentProblem(f"--port: cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    if grpc_port is not None:  # bound for a moment only: the gRPC server binds its own once the model is loaded
        try:
            bind(host, grpc_port).close()
        except OSError as exc:
            sock.close()
            raise EnvironmentProblem(f"--grpc-port: cannot listen on {host}:{grpc_port}: {exc.strerror or exc}") \
                from None
    with sock, loaded_models(model, tracking_uri, control, load_model or [], strict_readiness, instances,
                             _located, _warn, burst_fallback_ms) as (models, what):
        max_body = int(max_body_mb * 1024 * 1024) if max_body_mb is not None else max(
            [body_limit(c) for c in models.configs()], default=MIN_BODY_BYTES)
        names = models.catalog.names()
        route = names[0] if len(names) == 1 else "NAME"
        out.print(f"serving {what} at http://{host}:{sock.getsockname()[1]}/v2/models/{route} once warm "
                  "(GET /v2/health/ready answers 200); Ctrl-C stops", soft_wrap=True)
        grpc_server = None
        regions = ClientRegions(allow_client_shm)  # one namespace for REST and gRPC, as in Triton
        if grpc_port is not None:  # shares the models: ModelInfer answers UNAVAILABLE until the warm-up is done
            grpc_server = GrpcServer(models, host, grpc_port, max_body, regions)
            try:
                grpc_server.start()
            except OSError as exc:
                raise EnvironmentProblem(f"--grpc-port: {exc}") from None
            out.print(f"serving {what} over gRPC (KServe v2 GRPCInferenceService) at {host}:{grpc_port}",
                      soft_wrap=True)
        try:
            run_server(models, sock, max_body, max_connections, regions)
        except LoadFailed as exc:  # a startup model's version cannot be served: the repository's, or this host's
            if isinstance(exc.__cause__, EnvironmentProblem):
                raise EnvironmentProblem(str(exc)) from exc
            raise RecipeError(model, "", str(exc)) from exc
        finally:
            if grpc_server is not None:
                grpc_server.stop()
            regions.close()  # every region a client left registered


@app.command("export-triton")
def export_triton(
    model: Annotated[str, typer.Argument(
        help="what `temper serve` takes: a serving bundle folder, a run's output folder (its selected model) or "
             "OUTPUT/CANDIDATE, or models:/NAME@ALIAS or models:/NAME/VERSION", show_default=False)],
    dest: Annotated[Path, folder_option("--dest", help="Triton model repository to write into")],
    instances: Annotated[int | None, number(
        "--instances", "model instances per device; default: the bundle's capacity.json choice, else 1", 1,
        2**31 - 1)] = None,
    kind: Annotated[str, typer.Option("--kind", help="KIND_AUTO, KIND_GPU or KIND_CPU; KIND_AUTO follows the engine "
                                                     "the model was gated on (a CPU one: KIND_CPU); the cluster's pods "
                                                     "ask for one GPU unless KIND_CPU")] = "KIND_AUTO",
    image: Annotated[str, typer.Option("--image", help="Triton container image the cluster runs")] = IMAGE,
    storage_uri: Annotated[str, typer.Option(
        "--storage-uri", help="where the cluster finds this repository: pvc://CLAIM, s3://BUCKET or gs://BUCKET, "
                              "each with an optional /PATH")] = STORAGE_URI,
    manifests: Annotated[Path | None, folder_option(
        "--manifests",
        help="folder for the Kubernetes and KServe manifests, one subfolder per model (default: DEST-kubernetes, "
             "beside DEST; never DEST, in it or around it)",
        show_default=False)] = None,
    version: Annotated[int | None, number(
        "--version", "the version folder to write (beside those already there); default: the registry version of "
                     "a models:/ model or a pulled bundle, else 1", 1, 2**63 - 1)] = None,
    tracking_uri: TrackingOpt = None,
) -> None:
    """Write a Triton model repository (config.pbtxt with dynamic batching and warm-up) for a model, and the
    Kubernetes Deployment, Service and KServe InferenceService that run it on a cluster."""
    from dataclasses import replace

    from temper.artifacts.formats.bundle import read
    from temper.artifacts.triton.cluster import FILES, BadSetting, Cluster, writable, write_manifests
    from temper.artifacts.triton.config import differences, export_repository, folder_name, plan

    try:  # before anything is read or written
        cluster = Cluster(image, storage_uri)
    except BadSetting as exc:
        raise RecipeError(model, f"--{exc.field.replace('_', '-')}", str(exc)) from None
    kube = manifests or beside(dest)
    if manifests is not None:  # writing either folder would replace or land in the other
        apart(manifests, dest)
    for flag, parent in (("--dest", dest), ("--manifests", kube)):
        unowned(flag, parent)
        can_hold(flag, parent)  # both before either is written: never a repository without its manifests
    with _located(model, tracking_uri) as (folder, config, unchecked, served):
        given = config
        try:
            config = config or read(folder)
            name = folder_name(config.name)
            chosen = plan(folder, config, instances, kind)
        except Exception as exc:
            raise RecipeError(model, "MODEL", first_line(exc)) from exc
        threads = chosen.config.session.threads if chosen.config.session is not None else 1
        cpus = 1 if chosen.gpu else chosen.instances * threads  # a GPU instance: one core feeds it
        cluster = replace(cluster, gpu=chosen.gpu, cpus=cpus, capacity=chosen.capacity)
        unowned("--dest", dest, dest / name, "export-triton")
        unowned("--manifests", kube, kube / name, "manifests")
        try:  # a foreign folder in the way of the manifests: refused before either folder is written
            writable(kube, config.name)
        except FileExistsError as exc:
            raise RecipeError(str(kube), "--manifests", str(exc)) from None
        try:
            written = export_repository(folder, dest, instances=instances, kind=kind, config=given,
                                        version=str(version or served), evidence=_vouching_output(folder, given))
        except FileExistsError as exc:  # the model's folder there is not temper's
            raise RecipeError(str(dest), "--dest", str(exc)) from None
        except OSError as exc:  # a full disk (exit 3), a folder this user cannot write
            raise unwritable(dest, "--dest", exc, "the repository") from exc
        except Exception as exc:  # not a bundle, a bad --kind
            raise RecipeError(model, "MODEL", first_line(exc)) from exc
        try:
            cluster_folder = write_manifests(kube, config.name, cluster)
        except OSError as exc:
            raise unwritable(kube, "--manifests", exc, "the manifests") from exc
    _warn(unchecked)  # once it is done: an error stays the one line it is
    out.print(Text(f"wrote Triton model {written.name} to {dest}:"), soft_wrap=True)
    for item in sorted(written.rglob("*")):
        if item.is_file():
            out.print(Text(f"  {item.relative_to(dest)}  {item.stat().st_size:,} bytes"), soft_wrap=True)
    out.print(Text(f"wrote what a cluster needs to run it from {storage_uri} on {image}"
                   f"{' with 1 GPU' if cluster.gpu else ''} to {cluster_folder}:"), soft_wrap=True)
    for file, what in FILES.items():
        if (cluster_folder / file).is_file():
            out.print(Text(f"  {file}  {what}"), soft_wrap=True)
    if cluster.capacity is None:
        out.print(Text("  no alert rules, autoscaler or memory request: the bundle has no capacity.json; measure "
                       "one with `temper capacity BUNDLE --p99-ms MS`, then export again"), soft_wrap=True)
    out.print("unlike temper serve, on Triton:")
    for difference in differences(config):
        out.print(Text(f"  {difference}"), soft_wrap=True)


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
