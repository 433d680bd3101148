"""The library versions a bundle's gates ran on, and how this process's differ from them.

ONNX Runtime's releases change what a quantized model computes and costs (1.21 changed numerics and
stopped quantizing some layers; 1.24 costs 15-20% more CPU on a quantized model), so a bundle records
the versions its gates held on and the serving runtime says when it runs on others.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

TRACKED = ("onnxruntime", "onnx", "numpy", "temper-ml")
_DISTRIBUTIONS = {"onnxruntime": ("onnxruntime", "onnxruntime-gpu")}  # either provides `import onnxruntime`


def current() -> dict[str, str]:
    """The installed versions of TRACKED; one that is not installed (temper-ml beside an MLflow model
    that ships its own code) is left out."""
    found = {}
    for library in TRACKED:
        for distribution in _DISTRIBUTIONS.get(library, (library,)):
            try:
                found[library] = version(distribution)
                break
            except PackageNotFoundError:
                continue
    return found


def drift(recorded: dict[str, str], now: dict[str, str] | None = None) -> list[str]:
    """`library NOW (gated on THEN)` for each recorded library whose installed version differs."""
    now = current() if now is None else now
    return [f"{library} {now[library]} (gated on {then})" for library, then in recorded.items()
            if library in now and now[library] != then]
