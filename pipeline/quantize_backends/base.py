"""What every quantize backend is: its options model (the keys every backend takes, and its own) and the
`Backend` protocol the quantize step (pipeline/steps/quantize/) calls.

A backend is one module of this package: its options model (a subclass of `QuantizeCommon` whose `backend`
is its name as a Literal), and an object implementing `Backend` (its library checked, its options checked
against the graph-free rules it has, the quantize call); one entry in the registry (`__init__.py`); one extra
in pyproject.toml. The modules here are recipe contracts (pipeline/recipe.py reads their options models), so
they import nothing of pipeline/ but contracts, and their libraries only where they run.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, TypeVar

from pydantic import Field, ValidationInfo, model_validator

from temper.artifacts.core.layout import Layout
from temper.artifacts.core.onnx_io import Batch
from temper.artifacts.core.strict import Strict
from temper.pipeline import presets

if TYPE_CHECKING:
    import onnx

    from temper.pipeline.quantize_backends.quantize_static import KeptRanges


class QuantizeCommon(Strict):
    """The keys every quantize backend takes; each backend's model adds its own (and its `backend` Literal)."""

    mode: Literal["dynamic", "static"]
    backend: str = "ort"  # each backend's model narrows it to its name: the union's tag
    exclude_nodes: list[str] = Field(default_factory=list, description="node names kept in float")
    exclude_op_types: list[str] = Field(default_factory=list, description="op types kept in float")

    searchable: ClassVar[tuple[str, ...]] = ()
    """Its scalar options whose list value in a recipe means "try each" (the step's `searchable`)."""
    instead: ClassVar[dict[str, str]] = {}
    """For a key of another backend this one does not take: what it does instead (the loader's message);
    a key without an entry is named as the other backend's option."""

    @model_validator(mode="before")
    @classmethod
    def _preset(cls, value: Any, info: ValidationInfo) -> Any:
        """Resolve the preset before validation (ONNX Runtime's target presets fill its options; other backends
        drop `preset: auto`); the loader passes the recipe's target as context."""
        choice = (info.context or {}).get("preset_choice")
        return presets.fill(value, choice) if isinstance(value, dict) else value

    def only_static(self) -> None:
        """ValueError for mode: dynamic, which only ONNX Runtime's quantizer implements."""
        if self.mode == "dynamic":
            raise ValueError("mode: dynamic is implemented by backend: ort only")


Options = TypeVar("Options", bound=QuantizeCommon)


@dataclass(frozen=True)
class Job:
    """One quantize call's input, as the step prepared it: the graph (without its weights), whether it needs
    external data, a private scratch folder, the inputs' batch axes, and the calibration data on demand."""

    src: Path
    dst: Path
    structure: onnx.ModelProto
    large: bool  # past protobuf's 2 GB: weights as external data
    scratch: Path
    layout: Layout
    feeds: Callable[[Layout], list[Batch]]  # the calibration batches, as feeds in the given layout
    typed: list[str]  # the input graph's nodes of the excluded op types (kept float by name too)
    ranges: KeptRanges | None = None  # where calibrations are kept between candidates (pipeline.cache)


class Backend(Protocol[Options]):
    """One quantize backend (ONNX Runtime's quantizer, NVIDIA ModelOpt, Intel NNCF, ...)."""

    @property
    def name(self) -> str:
        """The recipe's `backend:` value."""
        ...

    @property
    def label(self) -> str:
        """Its library in words ("NNCF"), for messages."""
        ...

    @property
    def options(self) -> type[Options]:
        """Its options model."""
        ...

    @property
    def libraries(self) -> tuple[str, ...]:
        """Its libraries, as artifacts/core/distributions.py's table names them: part of every step's cache key."""
        ...

    def require(self) -> Any:
        """Its library, imported (EnvironmentProblem naming its extra when it is not installed)."""
        ...

    def validate(self, options: Options) -> None:
        """OptionError(key, message) for a value of its own options it cannot honour."""
        ...

    def stage(self, options: Options) -> str:
        """What runs, in words, for a failure's line ("NNCF quantization")."""
        ...

    def quantize(self, job: Job, options: Options) -> None:
        """Write the quantized model of `job.src` to `job.dst`."""
        ...


@contextlib.contextmanager
def quiet_logger(logger: logging.Logger) -> Iterator[None]:
    """Only `logger`'s errors while a library runs: torch.onnx and NNCF log progress the CLI shows its own way."""
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def library_missing(backend: str, library: str, extra: str, err: ImportError) -> str:
    """The one line of a backend whose library does not import."""
    cause = str(err).splitlines()[0] if str(err) else type(err).__name__
    return f"quantize backend '{backend}' needs {library}: pip install 'temper-ml[{extra}]' ({cause})"
