"""The flags of deploy.py's commands (`temper serve`, `temper export-triton`) as typer options, kept apart so
that each command is what it does: parse, then hand over (pipeline/cli/servers.py, pipeline/cli/exporting.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from temper.pipeline.cli.common import folder_option, number

MAX_BODY_MB = 2047  # gRPC's message limit is a C int (2 GiB less a byte); a REST body that size is a typo too

Served = Annotated[str, typer.Argument(
    help="serving bundle folder; a run's output folder (its selected model) or OUTPUT/CANDIDATE; "
         "models:/NAME@ALIAS or models:/NAME/VERSION; or a model repository (what export-triton writes: "
         "MODEL/VERSION/ bundle folders, the highest version of each served)", show_default=False)]
Host = Annotated[str, typer.Option(
    "--host", help="address to bind; 0.0.0.0 exposes the server beyond this machine")]
Port = Annotated[int, number("--port", "TCP port; 0: one the system picks", 0, 65535)]
MaxBodyMb = Annotated[float | None, number(
    "--max-body-mb", "refuse larger request bodies with HTTP 413; default: a full batch of the model's inputs as "
                     "JSON, at least 1 MiB", 0.001, MAX_BODY_MB)]
MaxConnections = Annotated[int | None, number(
    "--max-connections", "open HTTP connections at most; one more closes the longest idle one; default: what the "
                         "open-file limit leaves room for, at most 4096", 1)]
GrpcPort = Annotated[int | None, number(
    "--grpc-port", "also serve KServe v2 gRPC on this port (needs the grpc extra)", 1, 65535)]
AllowClientShm = Annotated[bool, typer.Option(
    "--allow-client-shm", help="let local clients register system shared memory regions (Triton's extension) "
                               "for inputs and outputs; anyone who can reach the port can then make the server "
                               "read and write the shared memory they name")]
Instances = Annotated[int | None, number(
    "--instances", "worker processes running the model (Triton's instance_group count), each isolated: a crash "
                   "in one is restarted and fails only the batch it ran; 0: in the server's own process; "
                   "default: usable cores over the model's intra-op threads (1 on a GPU), 0 for a model that runs "
                   "inline (faster than the hand-off to a worker)", 0, 64)]
Control = Annotated[str, typer.Option(
    "--model-control-mode", help="none: every model of a repository is loaded at start and load/unload are "
                                 "refused; explicit: only the --load-model ones, the others through the "
                                 "repository load API (Triton's modes)")]
LoadModel = Annotated[list[str] | None, typer.Option(
    "--load-model", help="a model to load at start with --model-control-mode explicit; repeatable; '*': all",
    show_default=False)]
StrictReadiness = Annotated[bool, typer.Option(
    "--strict-readiness/--no-strict-readiness",
    help="/v2/health/ready answers 200 only once every model asked for is loaded and warmed up; off: once the "
         "server is up")]
BurstFallbackMs = Annotated[float | None, number(
    "--burst-fallback-ms", "latency target of the burst fallback (off by default): requests go to the bundle's "
                           "backup model (its backup/ folder; a run's output folder: the fastest other pair that "
                           "passed every gate) while the primary's queue would make them wait longer, and back "
                           "once it is under half of it", 0.001)]

# export-triton
ExportedModel = Annotated[str, typer.Argument(
    help="what `temper serve` takes: a serving bundle folder, a run's output folder (its selected model) or "
         "OUTPUT/CANDIDATE, or models:/NAME@ALIAS or models:/NAME/VERSION", show_default=False)]
ExportDest = Annotated[Path, folder_option("--dest", help="Triton model repository to write into")]
ExportInstances = Annotated[int | None, number(
    "--instances", "model instances per device; default: the bundle's capacity.json choice, else 1", 1,
    2**31 - 1)]
Kind = Annotated[str, typer.Option("--kind", help="KIND_AUTO, KIND_GPU or KIND_CPU; KIND_AUTO follows the engine "
                                                 "the model was gated on (a CPU one: KIND_CPU); the cluster's pods "
                                                 "ask for one GPU unless KIND_CPU")]
Image = Annotated[str, typer.Option("--image", help="Triton container image the cluster runs")]
StorageUri = Annotated[str, typer.Option(
    "--storage-uri", help="where the cluster finds this repository: pvc://CLAIM, s3://BUCKET or gs://BUCKET, "
                          "each with an optional /PATH")]
Manifests = Annotated[Path | None, folder_option(
    "--manifests",
    help="folder for the Kubernetes and KServe manifests, one subfolder per model (default: DEST-kubernetes, "
         "beside DEST; never DEST, in it or around it)",
    show_default=False)]
ExportVersion = Annotated[int | None, number(
    "--version", "the version folder to write (beside those already there); default: the registry version of "
                 "a models:/ model or a pulled bundle, else 1", 1, 2**63 - 1)]
