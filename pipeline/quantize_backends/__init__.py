"""The quantize step's backends: one module each, registered here, each with its own options model.

- `base.py` — `QuantizeCommon` (the keys every backend takes), the `Backend` protocol, the `Job` it quantizes.
- `ort.py` — ONNX Runtime's quantizer: `quantize_dynamic.py`, `quantize_static.py` (the calibrator driven
  directly, `entropy.py` its threshold search), both after `preprocess.py`; `failures.py` turns a library
  failure into one line (stage, node, way out).
- `modelopt.py` — NVIDIA ModelOpt's ONNX PTQ; `nncf.py` — Intel NNCF's (optional extras).

A new backend is its module (options model + `Backend`), its entry in BACKENDS and its extra in
pyproject.toml; its `libraries` (rows of artifacts/core/distributions.py) join every step's cache key.
`QuantizeOptions`, the recipe's `quantize:` model, is the union of the backends' options models,
told apart by `backend` (ort when unset).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Union

from pydantic import Discriminator, Tag, TypeAdapter

from temper.pipeline.quantize_backends.base import Backend, Job, QuantizeCommon
from temper.pipeline.quantize_backends.modelopt import MODELOPT, ModelOptOptions
from temper.pipeline.quantize_backends.nncf import NNCF, NncfOptions
from temper.pipeline.quantize_backends.ort import ORT, OrtOptions

BACKENDS: dict[str, Backend[Any]] = {backend.name: backend for backend in (ORT, MODELOPT, NNCF)}
DEFAULT = ORT.name


def backend_of(value: Any) -> str:
    """The union's tag: a mapping's `backend` (ort when unset), or a model's; an unknown one is pydantic's
    union_tag_invalid, which the loader words with the registry's names."""
    chosen = value.get("backend", DEFAULT) if isinstance(value, dict) else getattr(value, "backend", DEFAULT)
    return chosen if isinstance(chosen, str) else repr(chosen)


if TYPE_CHECKING:
    QuantizeOptions = QuantizeCommon
else:
    QuantizeOptions = Annotated[
        Union[tuple(Annotated[backend.options, Tag(name)] for name, backend in BACKENDS.items())],  # noqa: UP007
        Discriminator(backend_of),
    ]

_ADAPTER: TypeAdapter[QuantizeCommon] = TypeAdapter(QuantizeOptions)


def quantize_options(data: dict[str, Any], context: dict[str, Any] | None = None) -> QuantizeCommon:
    """A quantize step's options as a recipe writes them, as its backend's model (pydantic's ValidationError)."""
    return _ADAPTER.validate_python(data, context=context)


def models() -> tuple[type[QuantizeCommon], ...]:
    """Every backend's options model, in the registry's order."""
    return tuple(backend.options for backend in BACKENDS.values())


__all__ = ["BACKENDS", "Backend", "Job", "ModelOptOptions", "NncfOptions", "OrtOptions", "QuantizeCommon",
           "QuantizeOptions", "models", "quantize_options"]
