"""The step interface: ONNX file in, ONNX file out, options from one pydantic model.

A step declares everything the rest of temper asks about it on its class: its options model, whether
its output depends on the calibration or evaluation data, the precision it leaves the model in, and
which options a recipe may search. The registry (pipeline/steps/__init__.py) and pipeline/search.py
read these declarations; nothing else keeps a table of step names.

The registry is read while a recipe loads, before any model is built, so a step module imports what
pulls in torch (onnxsim, onnxruntime.tools) where it runs, never at module level
(tests/pipeline/steps/test_registry.py holds the loader to that).
"""

from __future__ import annotations

import typing
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar

from pydantic import BaseModel

from temper.artifacts.core.errors import OptionError, StepFailed, close_names
from temper.artifacts.core.layout import Layout
from temper.artifacts.core.onnx_io import Batch
from temper.pipeline.input_layout import layout_of
from temper.pipeline.recipe import InputSpec

if TYPE_CHECKING:
    import onnx

    from temper.pipeline.quantize_backends.quantize_static import KeptRanges
    from temper.validators.scoring import Score

Options = TypeVar("Options", bound=BaseModel)


class Scorer(Protocol):
    """The recipe's gates as a step can use them: a model's metric, drop and fidelity on the
    evaluation set, and a quick speed reading for reports."""

    metric: str
    baseline_metric: float
    allowed_drop: float

    def score(self, model: Path) -> Score: ...

    def speed(self, model: Path) -> float | None:
        """Samples/s at the recipe's largest throughput batch size, or None without a throughput section."""
        ...


@dataclass(frozen=True)
class StepContext:
    """What a step may use besides its input model. Data loads lazily: most steps never touch it."""

    inputs: list[InputSpec]
    calibration: Callable[[], list[Batch]]  # full-size batches in the model's layout; RecipeError when none
    sample: Callable[[], Batch]  # one real batch for sanity checks (NaN/Inf, output comparison), laid out alike
    scratch: Path  # a private empty folder for intermediate files
    scorer: Callable[[], Scorer] = field(default=lambda: _no_scorer())  # for steps with uses_evaluation
    progress: Callable[[str], None] = field(default=lambda _: None)  # what a long step is doing now (the observer)
    ranges: KeptRanges | None = None  # the cache's ranges/ (calibrations kept); None: calibrate each time
    log: Callable[[str], None] = field(default=lambda _: None)  # a piece of a long step that finished (a trial)


    @property
    def layout(self) -> Layout:
        """Each input's batch axis and the constant inputs: what fit_batch and batch splits need."""
        return layout_of(self.inputs)


def _no_scorer() -> Scorer:
    raise StepFailed("this step aims at the accuracy budget: the recipe needs validate.accuracy")


class Step(ABC, Generic[Options]):
    """A registered step. `validate` is cheap and runs before `run` (and in `temper check`)."""

    name: ClassVar[str]
    """The key a recipe writes (`- quantize: {...}`): StepSpec's field holding `options_model`."""
    options_model: ClassVar[Any]
    """The pydantic model of its options (in pipeline.step_options), or a tagged union of models (quantize: one
    per backend, pipeline/quantize_backends/)."""
    searchable: ClassVar[tuple[str, ...]] = ()
    """Scalar options whose list value in a recipe means "try each" (pipeline/search.py expands them)."""
    budget_option: ClassVar[str | None] = None
    """The option that, when set, makes the step aim at validate.accuracy (quantize: fallback)."""

    @classmethod
    def option_models(cls) -> tuple[type[BaseModel], ...]:
        """The models its options may be: `options_model`, or the members of its tagged union."""
        return models_in(cls.options_model)

    def uses_calibration(self, options: Options) -> bool:
        """True when the output depends on the calibration data, which then joins the cache key."""
        return False

    def uses_evaluation(self, options: Options) -> bool:
        """True when the output depends on the accuracy gate (data, metric, budget, baseline): all join the key."""
        return self.budget_option is not None and getattr(options, self.budget_option) is not None

    def precision(self, options: Options) -> str | None:
        """The number format the step leaves the weights in (fp16, int8-static...); None: it keeps the input's."""
        return None

    def validate(self, model: onnx.ModelProto, options: Options) -> None:
        """Raise OptionError(key, message) when an option names something the graph lacks."""

    @abstractmethod
    def run(self, src: Path, dst: Path, options: Options, ctx: StepContext) -> None:
        """Read the model at `src`, write the transformed model to `dst`; raise StepFailed when it cannot."""


def models_in(annotation: Any) -> tuple[type[BaseModel], ...]:
    """The pydantic models an annotation holds: itself, or an (Annotated, tagged) union's members."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return (annotation,)
    return tuple(model for arg in typing.get_args(annotation) for model in models_in(arg))


def require_known(key: str, what: str, wanted: list[str], present: list[str]) -> None:
    """Raise OptionError for the first name not in `present`, with the closest real names as a hint."""
    known = set(present)
    for index, name in enumerate(wanted):
        if name in known:
            continue
        close = close_names(name, present)
        if close:
            hint = "closest: " + ", ".join(close)
        elif present:
            hint = "it has: " + ", ".join(present[:5]) + (", ..." if len(present) > 5 else "")
        else:
            hint = f"the graph has no named {what}s"
        raise OptionError(f"{key}[{index}]", f"{what} '{name}' is not in the graph; {hint}")
