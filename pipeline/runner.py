"""Run a recipe: source model -> shared steps (the FP32 baseline) -> each candidate's steps.

Every step goes through the content-addressed cache; the runner knows nothing of the CLI (progress
goes to an `Observer`) and nothing of validation or publishing, which consume its `RunResult`.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import onnx

from temper.artifacts.core import onnx_io
from temper.artifacts.core.callables import call_user, load_callable, split_ref
from temper.artifacts.core.errors import (
    OptionError,
    RecipeError,
    StepFailed,
    TemperError,
    first_line,
    reraise_interrupt,
)
from temper.artifacts.core.folders import claim, discard, sweep
from temper.artifacts.core.layout import Layout
from temper.artifacts.core.onnx_io import fingerprint
from temper.artifacts.formats.integrity import sha256_of
from temper.calibration.sources import Dataset, load
from temper.calibration.spec import DataSource
from temper.pipeline.cache import MODEL_FILE, OutputStore, RangeStore, StepCache, cache_versions, key_of
from temper.pipeline.input_check import as_declared, check_batch, check_graph
from temper.pipeline.input_layout import layout_of
from temper.pipeline.loading import LoadedRecipe
from temper.pipeline.recipe import StepSpec

if TYPE_CHECKING:  # the steps import onnxsim, ORT's quantizers and (via onnxruntime.tools) torch: not at start-up
    from temper.artifacts.core.onnx_io import Batch
    from temper.pipeline.steps.base import StepContext
    from temper.validators.scoring import GateScorer

SCRATCH = "temper-run-"  # the runner's scratch folders in the system temp folder: temper-run-<pid>-<random>


@dataclass(frozen=True)
class ModelRecord:
    """One model the run produced: what made it, from what, and how long it took (when first built)."""

    id: str
    parent: str | None
    step: str
    options: dict[str, Any]
    path: Path
    sha256: str
    bytes: int
    seconds: float
    cached: bool

    def as_dict(self) -> dict[str, Any]:
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in self.__dict__.items() if k != "path"}


@dataclass
class CandidateOutcome:
    name: str
    records: list[ModelRecord] = field(default_factory=list)
    error: str | None = None
    failure: str | None = None  # StepFailed.kind: "rejected" (a verdict, like a gate's) or "error" (it raised)

    @property
    def model(self) -> ModelRecord | None:
        return None if self.error else self.records[-1]


@dataclass
class RunResult:
    baseline: list[ModelRecord]  # source model, then one record per shared step; the last is the baseline
    candidates: list[CandidateOutcome]
    output_axes: dict[str, int | None] = field(default_factory=dict)  # each output's batch axis (Runner.layout)

    @property
    def ok(self) -> bool:
        return all(c.error is None for c in self.candidates)


class Observer(Protocol):
    def started(self, chain: str, step: str) -> None: ...
    def finished(self, chain: str, record: ModelRecord) -> None: ...
    def note(self, text: str) -> None: ...  # what a longer phase (validation) is doing now
    # a piece of a long phase that finished (a fallback trial scored, a pair timed at a batch size): where
    # progress is not shown live (a CI log), a line of its own
    def logged(self, text: str) -> None: ...


class _Silent:
    """The observer when nobody watches (library use, `temper check`): progress goes nowhere."""

    def started(self, chain: str, step: str) -> None: ...
    def finished(self, chain: str, record: ModelRecord) -> None: ...
    def note(self, text: str) -> None: ...
    def logged(self, text: str) -> None: ...


class Runner:
    def __init__(self, loaded: LoadedRecipe, cache: StepCache, observer: Observer | None = None) -> None:
        self.loaded, self.recipe, self.cache = loaded, loaded.recipe, cache
        self.observer = observer or _Silent()
        self.versions = cache_versions()  # part of every step's key
        temp = Path(tempfile.gettempdir())
        sweep(temp, SCRATCH)  # what killed runs left: a live run holds its lock, wherever it runs
        self.scratch = claim(temp, SCRATCH, mode=0o700)
        self._shared: list[ModelRecord] | None = None  # baseline()'s records, once built
        self._layouts: dict[Path, Layout] = {}

    def close(self) -> None:
        discard(self.scratch)

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc_info: object) -> None:
        """Its scratch folder goes whatever happened: an error, an interruption or a normal end."""
        self.close()

    # -- data -------------------------------------------------------------------------------------
    def _dataset(self, which: str) -> Dataset | None:
        source: DataSource | None = getattr(self.recipe.data, which)
        if source is None:
            return None
        fed = [(index, spec) for index, spec in enumerate(self.recipe.model.inputs) if spec.value is None]
        data = load(source, self.loaded.base, self.loaded.file, f"data.{which}", [spec.name for _, spec in fed],
                    {spec.name: spec.batch_axis for _, spec in fed})
        return Dataset({spec.name: as_declared(self.loaded.file, index, spec, data.features[spec.name], which)
                        for index, spec in fed}, data.labels)

    @cached_property
    def calibration_set(self) -> Dataset | None:
        return self._dataset("calibration")

    @cached_property
    def evaluation_set(self) -> Dataset | None:
        return self._dataset("evaluation")

    @cached_property
    def calibration_batches(self) -> list[Batch]:
        source, data = self.recipe.data.calibration, self.calibration_set
        if source is None or data is None:
            raise RecipeError(self.loaded.file, "data.calibration",
                              "static quantization needs calibration data: add data.calibration")
        batches = [self.input_layout.feed(rows) for rows in data.batches(source.batch_size)]
        if not batches:
            raise RecipeError(self.loaded.file, "data.calibration.batch_size",
                              f"the calibration set has {len(data)} samples, "
                              f"fewer than one batch of {source.batch_size}; "
                              "lower batch_size or add samples")
        return batches

    @cached_property
    def calibration_fingerprint(self) -> str:
        return fingerprint(self.calibration_batches)

    @cached_property
    def sample_fingerprint(self) -> str:
        """Steps check their output on the sample batch: a new sample must re-run those checks."""
        return fingerprint([self.sample()])

    @cached_property
    def evaluation_fingerprint(self) -> str:
        data = self.evaluation_set
        if data is None:
            return "none"
        labels = {} if data.labels is None else {"__labels__": np.asarray(data.labels)}
        return fingerprint([{**data.features, **labels}])

    @cached_property
    def scorer(self) -> GateScorer:
        """The accuracy gate for steps that aim at it; built on the baseline, so only after baseline()."""
        from temper.validators.scoring import GateScorer

        spec, evaluation = self.recipe.validation, self.recipe.data.evaluation
        if spec is None or spec.accuracy is None:
            raise RecipeError(self.loaded.file, "validate.accuracy",
                              "a quantize fallback aims at the accuracy budget: add validate.accuracy")
        if evaluation is None or self.evaluation_set is None:
            raise RecipeError(self.loaded.file, "data.evaluation",
                              "a quantize fallback scores trials on the evaluation set: add data.evaluation")
        assert self._shared is not None, "baseline() runs before any candidate step"
        return GateScorer(spec, self._shared[-1].path, list(self.recipe.model.outputs), self.evaluation_set,
                          self.calibration_set, evaluation.batch_size, self.loaded.base, self.loaded.file,
                          self.layout(self._shared[-1].path), OutputStore.beside(self.cache))

    @cached_property
    def input_layout(self) -> Layout:
        """The recipe's batch axes and constants: how every batch is laid out for the model."""
        return layout_of(self.recipe.model.inputs)

    def layout(self, baseline: Path) -> Layout:
        """input_layout with each output's batch axis, from `baseline` run on real samples (a layout it does
        not take is a RecipeError naming the input, pipeline.input_check); without data, axis 0."""
        if baseline not in self._layouts:
            found = self._sample_rows()
            self._layouts[baseline] = self.input_layout if found is None else check_batch(
                baseline, self.input_layout, found[1], f"data.{found[0]}", self.recipe.model.inputs, self.loaded.file)
        return self._layouts[baseline]

    def _sample_rows(self) -> tuple[str, dict[str, np.ndarray]] | None:
        """Which data set and one real batch of its rows (samples first): evaluation data first (what the
        model will see), else calibration data; None without either."""
        for which in ("evaluation", "calibration"):
            source, data = getattr(self.recipe.data, which), getattr(self, f"{which}_set")
            if data is not None and len(data):
                return which, data.batches(min(source.batch_size, len(data)))[0]
        return None

    def sample(self) -> Batch:
        """One real batch, laid out for the model."""
        found = self._sample_rows()
        if found is None:
            raise RecipeError(self.loaded.file, "data",
                              "this recipe's steps need a real batch: add data.evaluation or data.calibration")
        return self.input_layout.feed(found[1])

    def _context(self, folder: Path, where: str) -> StepContext:
        from temper.pipeline.steps.base import StepContext

        return StepContext(self.recipe.model.inputs, lambda: self.calibration_batches, self.sample, folder,
                           lambda: self.scorer, lambda text: self.observer.note(f"{where} › {text}"),
                           RangeStore.beside(self.cache), lambda text: self.observer.logged(f"{where} › {text}"))

    # -- models -----------------------------------------------------------------------------------
    def source(self) -> ModelRecord:
        """The model as the recipe names it: exported from the factory (cached), or the ONNX file."""
        spec = self.recipe.model
        if spec.onnx is not None:
            return self._onnx_source()
        factory = spec.factory
        assert factory is not None  # ModelSpec holds a factory or an ONNX file
        path, function = split_ref(factory, self.loaded.base)
        depends = []
        for i, dep in enumerate(spec.depends_on):
            dep_path = self.loaded.path(dep)
            if not dep_path.is_file():
                raise RecipeError(self.loaded.file, f"model.depends_on[{i}]", f"'{dep_path}' not found")
            depends.append(sha256_of(dep_path))
        factory_sha = sha256_of(path) if path.is_file() else "missing"
        options = spec.export.model_dump(mode="json")
        key = key_of(step="export", factory=factory_sha, function=function, depends=depends,
                     inputs=[i.model_dump(mode="json") for i in spec.inputs], outputs=spec.outputs,
                     options=options, versions=self.versions, sample=self.sample_fingerprint)

        def build(dst: Path, ctx: StepContext) -> None:
            from temper.pipeline.steps.export import export

            fn = load_callable(factory, self.loaded.base, self.loaded.file, "model.factory")
            module = call_user(fn, self.loaded.file, "model.factory")
            import torch

            if not isinstance(module, torch.nn.Module):
                raise RecipeError(self.loaded.file, "model.factory",
                                  f"returned {type(module).__name__}, not a torch.nn.Module")
            try:
                export(module, spec, ctx.sample(), dst, ctx.scratch)
            except OptionError as exc:  # the declared inputs do not fit the module: bad input, at its key
                raise RecipeError(self.loaded.file, f"model.{exc.key}", exc.message) from None

        return self._cached("source", None, "export", options, key, build)

    def _onnx_source(self) -> ModelRecord:
        spec, file = self.recipe.model, self.loaded.file
        assert spec.onnx is not None  # source() came here for an ONNX file
        path = self.loaded.path(spec.onnx)
        if not path.is_file():
            raise RecipeError(file, "model.onnx", f"'{path}' not found (paths are relative to the recipe's folder)")
        try:
            onnx.checker.check_model(str(path))
            model = onnx_io.load_structure(path)
        except Exception as exc:
            raise RecipeError(file, "model.onnx",
                              f"'{path.name}' is not a valid ONNX model: {first_line(exc)}") from exc
        check_graph(model, spec, path.name, file)
        return ModelRecord("source", None, "load", {"onnx": spec.onnx}, path, sha256_of(path),
                           path.stat().st_size, 0.0, False)

    def chain(self, name: str, start: ModelRecord, steps: list[StepSpec], keypath: str) -> list[ModelRecord]:
        from temper.pipeline.steps import STEPS

        records = [start]
        for index, spec in enumerate(steps):
            step, options = STEPS[spec.name], spec.options
            where = f"{keypath}[{index}].{spec.name}"
            parent = records[-1]
            key_parts: dict[str, Any] = dict(step=spec.name, options=options.model_dump(mode="json"),
                                             input=parent.sha256, versions=self.versions,
                                             sample=self.sample_fingerprint)
            if step.uses_calibration(options):
                key_parts["data"] = self.calibration_fingerprint
            if step.uses_evaluation(options):
                gates = self.recipe.validation  # what it aims at; throughput only informs its report
                key_parts["gate"] = {"gates": (gates.model_dump(mode="json", include={"accuracy", "fidelity"})
                                               if gates else None),
                                     "evaluation": self.evaluation_fingerprint, "baseline": records[0].sha256}
            key = key_of(**key_parts)

            def build(dst: Path, ctx: StepContext, step=step, options=options, parent=parent, where=where) -> None:
                try:
                    step.validate(onnx_io.load_structure(parent.path), options)
                    step.run(parent.path, dst, options, ctx)
                except OptionError as exc:
                    raise RecipeError(self.loaded.file, f"{where}.{exc.key}", exc.message) from exc

            try:
                records.append(self._cached(f"{name}/{index + 1}-{spec.name}", parent.id, spec.name,
                                            options.model_dump(mode="json"), key, build, chain=name))
            except StepFailed as exc:  # a candidate's failure is reported and the run goes on; the baseline's ends it
                if name != "baseline":
                    raise
                raise StepFailed(f"{self.loaded.file}: {where}: the baseline cannot be built: {exc}") from exc
        return records

    def _cached(self, model_id: str, parent: str | None, step: str, options: dict[str, Any], key: str,
                build: Any, chain: str = "baseline") -> ModelRecord:
        self.observer.started(chain, step)
        hit = self.cache.get(key)
        if hit is not None:
            path, meta = hit
            cached, seconds = True, meta["seconds"]
        else:
            folder = Path(tempfile.mkdtemp(dir=self.scratch))
            (folder / "out").mkdir()
            (folder / "work").mkdir()
            dst = folder / "out" / MODEL_FILE
            begin = time.perf_counter()
            try:
                build(dst, self._context(folder / "work", f"{chain} › {step}"))
            except Exception as exc:  # a library failing inside a step: one line, cause kept for --debug
                reraise_interrupt(exc)  # a library failing on its way out of an interrupt: not the model's fault
                if isinstance(exc, TemperError):
                    raise
                raise StepFailed(f"{step}: {first_line(exc)}") from exc
            seconds = time.perf_counter() - begin
            if not dst.is_file():
                raise StepFailed(f"{step}: produced no model")
            path = self.cache.put(key, dst, {"seconds": seconds, "step": step, "options": options})
            cached = False
        record = ModelRecord(model_id, parent, step, options, path, sha256_of(path),
                             path.stat().st_size, round(seconds, 3), cached)
        self.observer.finished(chain, record)
        return record

    def baseline(self) -> list[ModelRecord]:
        """The source and the shared steps' records, built (or read from the cache) once per run: the
        pre-flight, `temper check` and the build all ask for it, and the user sees each step once."""
        if self._shared is None:
            self._shared = self.chain("baseline", self.source(), self.recipe.steps, "steps")
        return self._shared

    def run(self) -> RunResult:
        """Build the baseline, then every candidate; one candidate's failure does not stop the others."""
        base = self.baseline()
        output_axes = dict(self.layout(base[-1].path).outputs)
        outcomes = []
        for name, candidate in self.recipe.candidates.items():
            outcome = CandidateOutcome(name)
            try:
                outcome.records = self.chain(name, base[-1], candidate.steps, f"candidates.{name}.steps")[1:]
            except StepFailed as exc:
                outcome.error, outcome.failure = str(exc), exc.kind
            outcomes.append(outcome)
        return RunResult(base, outcomes, output_axes)

