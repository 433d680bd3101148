"""The one table of the Python distributions temper's results depend on, and who records each.

A library is named as records name it (`onnxruntime`); `distributions` are what pip installs for it, any one
of which provides it (`onnxruntime` or `onnxruntime-gpu`: both install the one `onnxruntime` package folder).
Each reader takes the rows of its role:

- `build`: part of every step's cache key (pipeline/cache.py), with each quantize backend's libraries
  (pipeline/quantize_backends/), so an upgrade never serves a stale model;
- `gated`: the versions a bundle's gates ran on (`gated_with`, artifacts/core/versions.py), and the drift from them;
- `served`: the pins of an MLflow model (artifacts/registry/pyfunc.py), beside its engine's packages;
- the host profile (artifacts/core/host.py) reads versions through `version_of`.

Only package metadata is read here: nothing is imported.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Literal

Role = Literal["build", "gated", "served"]


@dataclass(frozen=True)
class Library:
    name: str  # as records and pins name it
    roles: tuple[Role, ...]
    distributions: tuple[str, ...] = ()  # the alternatives that provide it, the usual one first (default: `name`)
    pin_extras: tuple[tuple[str, str], ...] = ()  # (distribution, "[extras]") a pin carries

    @property
    def alternatives(self) -> tuple[str, ...]:
        return self.distributions or (self.name,)


LIBRARIES: dict[str, Library] = {lib.name: lib for lib in (
    # a stand-in: onnxruntime-gpu provides `import onnxruntime` where it is installed instead, with its CUDA and
    # cuDNN wheels (its `cuda,cudnn` extras), which a GPU serving host needs as much as the runtime
    Library("onnxruntime", ("build", "gated", "served"), ("onnxruntime", "onnxruntime-gpu"),
            (("onnxruntime-gpu", "[cuda,cudnn]"),)),
    Library("numpy", ("build", "gated", "served")),
    Library("pandas", ("served",)),
    Library("mlflow", ("served",)),
    Library("onnx", ("build", "gated", "served")),
    Library("pydantic", ("served",)),
    Library("psutil", ("served",)),
    Library("platformdirs", ("served",)),
    Library("temper-ml", ("build", "gated")),
    Library("torch", ("build",)),
    Library("onnxsim", ("build",)),
    # the openvino engine's runtime (artifacts/engines/openvino.py): recorded where a bundle's gates had it
    Library("openvino", ("gated",)),
    # the quantize backends' own libraries: in every step's cache key through their registry
    # (pipeline/quantize_backends/), which names each backend's rows here
    Library("nvidia-modelopt", ()),
    Library("nncf", ()),
)}


def of_role(role: Role) -> tuple[str, ...]:
    """The libraries of one role, in the table's order."""
    return tuple(name for name, lib in LIBRARIES.items() if role in lib.roles)


def installed(name: str, stand_in_first: bool = False) -> tuple[str, str] | None:
    """(distribution, version) of the first alternative of `name` installed here; None when none is. A
    library not in the table is its own one distribution. `stand_in_first`: look the alternatives up last
    first, so a host with onnxruntime-gpu is read as having it (a pin for a GPU host)."""
    lib = LIBRARIES.get(name, Library(name, ()))
    order = lib.alternatives[::-1] if stand_in_first else lib.alternatives
    for distribution in order:
        try:
            return distribution, version(distribution)
        except PackageNotFoundError:
            continue
    return None


def distribution_version(distribution: str) -> str | None:
    """One distribution's installed version (not its library's alternatives); None when absent."""
    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


def version_of(name: str) -> str | None:
    """The installed version of `name` from whichever alternative provides it; None when absent."""
    found = installed(name)
    return None if found is None else found[1]


def pin(name: str) -> str:
    """`distribution[extras]==version` for what provides `name` here (PackageNotFoundError when nothing does)."""
    found = installed(name, stand_in_first=True)
    if found is None:
        raise PackageNotFoundError(name)
    distribution, number = found
    extras = dict(LIBRARIES[name].pin_extras if name in LIBRARIES else ()).get(distribution, "")
    return f"{distribution}{extras}=={number}"


def key_version(name: str) -> str:
    """A cache key's value for `name`: its version, with the distribution named when an alternative other
    than the usual one provides it (`onnxruntime-gpu 1.31.1`), and "absent" when none does."""
    found = installed(name)
    if found is None:
        return "absent"
    distribution, number = found
    usual = LIBRARIES[name].alternatives[0] if name in LIBRARIES else name
    return number if distribution == usual else f"{distribution} {number}"
