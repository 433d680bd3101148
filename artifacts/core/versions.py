"""The library versions a bundle's gates ran on, and how this process's differ from them.

ONNX Runtime's releases change what a quantized model computes and costs (1.21 changed numerics and
stopped quantizing some layers; 1.24 costs 15-20% more CPU on a quantized model), so a bundle records
the versions its gates held on and the serving runtime says when it runs on others. And exactly one
ONNX Runtime distribution must be installed for any of that to mean something (`require_one_runtime`).
"""

from __future__ import annotations

from temper.artifacts.core import distributions
from temper.artifacts.core.errors import EnvironmentProblem

# The distributions that provide `import onnxruntime`. Both install the one `onnxruntime` package folder, so with
# both the files of whichever installed last win (usually the CPU build's) and uninstalling either breaks the other.
RUNTIMES = distributions.LIBRARIES["onnxruntime"].alternatives
# The table's `gated` libraries (artifacts/core/distributions.py); "onnxruntime" is the version `import onnxruntime`
# runs, from either distribution, and a stand-in ("onnxruntime-gpu") is recorded too when it is the one installed,
# so a bundle says which build its gates ran on.
_GATED = distributions.of_role("gated")
_STAND_INS = tuple(alt for name in _GATED for alt in distributions.LIBRARIES[name].alternatives[1:])
TRACKED = (*_GATED, *_STAND_INS)
NONE_INSTALLED = ("no ONNX Runtime is installed: pip install 'temper-ml[cpu]', or 'temper-ml[gpu]' on an NVIDIA GPU "
                  "host")
REINSTALL = ("pip uninstall -y onnxruntime onnxruntime-gpu, then pip install 'temper-ml[gpu]' on an NVIDIA GPU host "
             "or 'temper-ml[cpu]' elsewhere")


def runtimes() -> dict[str, str]:
    """The ONNX Runtime distributions installed here, with their versions (package metadata: nothing is imported)."""
    found = {}
    for distribution in RUNTIMES:
        if (number := distributions.distribution_version(distribution)) is not None:
            found[distribution] = number
    return found


def require_one_runtime() -> None:
    """EnvironmentProblem (exit 3, one line naming the fix) unless exactly one ONNX Runtime distribution is
    installed: two share one package folder, and a session would run whichever files were written last."""
    found = runtimes()
    if len(found) > 1:
        both = " and ".join(f"{name} {v}" for name, v in found.items())
        raise EnvironmentProblem(f"two ONNX Runtimes are installed, {both}, and both provide `import onnxruntime` "
                                 f"(the files of the last one installed win, usually the CPU build's): {REINSTALL}")
    if not found:
        raise EnvironmentProblem(NONE_INSTALLED)


def current() -> dict[str, str]:
    """The installed versions of TRACKED; one that is not installed (temper-ml beside an MLflow model
    that ships its own code) is left out."""
    found = {library: distributions.version_of(library) for library in _GATED}
    found |= {stand_in: distributions.distribution_version(stand_in) for stand_in in _STAND_INS}
    return {library: number for library, number in found.items() if number is not None}


def drift(recorded: dict[str, str], now: dict[str, str] | None = None) -> list[str]:
    """`library NOW (gated on THEN)` for each recorded library whose installed version differs."""
    now = current() if now is None else now
    moved = [f"{library} {now[library]} (gated on {then})" for library, then in recorded.items()
             if library in now and now[library] != then]
    # gated on the GPU build, served by the CPU one: the same `onnxruntime` version would hide it
    return moved + [f"{library} absent (gated on {then})" for library, then in recorded.items()
                    if library in RUNTIMES and library != "onnxruntime" and library not in now]
