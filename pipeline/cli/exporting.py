"""What `temper export-triton` does once its flags are parsed: every destination checked before either is
written (never a repository without its manifests), the repository and the cluster's manifests written, and
what was written listed. Kept apart from deploy.py, which only parses the flags."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from rich.text import Text

from temper.artifacts.core.errors import RecipeError, first_line, unwritable
from temper.pipeline.cli.common import out
from temper.pipeline.cli.destinations import apart, beside, can_hold, unowned

if TYPE_CHECKING:
    from temper.artifacts.formats.bundle import ServingConfig
    from temper.artifacts.triton.cluster import Cluster


@dataclass(frozen=True)
class Exported:
    written: Path  # the model's folder in the repository
    cluster_folder: Path  # its manifests
    cluster: Cluster
    config: ServingConfig


def checked(model: str, dest: Path, manifests: Path | None, image: str, storage_uri: str) -> tuple[Cluster, Path]:
    """The cluster settings and the manifests' folder, with both destinations checked before anything is read."""
    from temper.artifacts.triton.cluster import BadSetting, Cluster

    try:
        cluster = Cluster(image, storage_uri)
    except BadSetting as exc:
        raise RecipeError(model, f"--{exc.field.replace('_', '-')}", str(exc)) from None
    kube = manifests or beside(dest)
    if manifests is not None:  # writing either folder would replace or land in the other
        apart(manifests, dest)
    for flag, parent in (("--dest", dest), ("--manifests", kube)):
        unowned(flag, parent)
        can_hold(flag, parent)  # both before either is written: never a repository without its manifests
    return cluster, kube


def export(model: str, folder: Path, given: ServingConfig | None, served: str, dest: Path, kube: Path,
           cluster: Cluster, instances: int | None, kind: str, version: int | None, evidence: Path | None
           ) -> Exported:
    """The model's Triton folder in `dest` and its manifests in `kube`."""
    from temper.artifacts.formats.bundle import read
    from temper.artifacts.triton.cluster import writable, write_manifests
    from temper.artifacts.triton.config import export_repository, folder_name, plan
    from temper.pipeline.outputs import backup_beside

    try:
        config = given or read(folder)
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
                                    version=str(version or served), evidence=evidence,
                                    backup=backup_beside(folder) if given is not None else None)
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
    return Exported(written, cluster_folder, cluster, config)


def show(done: Exported, dest: Path, image: str, storage_uri: str) -> None:
    """Every file written, what the cluster gets, and what differs from temper serve on Triton."""
    from temper.artifacts.triton.cluster import FILES
    from temper.artifacts.triton.config import differences

    out.print(Text(f"wrote Triton model {done.written.name} to {dest}:"), soft_wrap=True)
    for item in sorted(done.written.rglob("*")):
        if item.is_file():
            out.print(Text(f"  {item.relative_to(dest)}  {item.stat().st_size:,} bytes"), soft_wrap=True)
    out.print(Text(f"wrote what a cluster needs to run it from {storage_uri} on {image}"
                   f"{' with 1 GPU' if done.cluster.gpu else ''} to {done.cluster_folder}:"), soft_wrap=True)
    for file, what in FILES.items():
        if (done.cluster_folder / file).is_file():
            out.print(Text(f"  {file}  {what}"), soft_wrap=True)
    if done.cluster.capacity is None:
        out.print(Text("  no alert rules, autoscaler or memory request: the bundle has no capacity.json; measure "
                       "one with `temper capacity BUNDLE --p99-ms MS`, then export again"), soft_wrap=True)
    out.print("unlike temper serve, on Triton:")
    for difference in differences(done.config):
        out.print(Text(f"  {difference}"), soft_wrap=True)
