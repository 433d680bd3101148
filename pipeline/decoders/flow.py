"""A decoder recipe's whole job as a library: build the baseline and the candidates, gate them, select for the
workload, commit the output folder (each model's folder, report.json); returns the report and the exit code, as
pipeline/flow.py does for the CNN/encoder recipes."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from temper.artifacts.core.errors import EnvironmentProblem, RecipeError, first_line
from temper.artifacts.core.folders import claim, discard, mark, replaceable, swap_in, sweep
from temper.pipeline.decoders import build
from temper.pipeline.decoders.loading import LoadedDecoder
from temper.pipeline.decoders.text import text_set
from temper.validators.decoder_report import DecoderReport
from temper.validators.decoder_validation import Built, validate

REPORT = "report.json"


@dataclass
class DecoderOutcome:
    folder: Path
    report: DecoderReport
    missed: list[str] = field(default_factory=list)
    build_errors: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        """0 with a selection (a candidate or the baseline, with its reason); 1 when a --require'd candidate did
        not pass or a build raised (unless allowed), as for every recipe, or when the FP32 baseline does not match
        its source framework (every comparison is against it)."""
        return 1 if self.missed or self.build_errors or not self.report.baseline.passed else 0


def _place(src: Path, dst: Path) -> None:
    """A model folder into the output, copied: onnx refuses external data with several hard links."""
    dst.mkdir(parents=True)
    for item in src.iterdir():
        if item.is_file():
            shutil.copy2(item, dst / item.name)


def _staging(output: Path, file: str) -> Path:
    """A working folder beside `output`, locked while this process lives (artifacts/core/folders.py), after
    refusing an output folder temper did not write: nothing without temper's marker is ever replaced."""
    if not replaceable(output):
        raise RecipeError(file, "--output", f"{output} is a folder temper did not write: give a new or empty one")
    output.parent.mkdir(parents=True, exist_ok=True)
    prefix = f".{output.name}.partial-"
    sweep(output.parent, prefix)  # working folders of runs that died
    return claim(output.parent, prefix)


def _fits_context(loaded: LoadedDecoder, base: Path) -> None:
    """Every sequence the gates run must fit the model's context window (genai_config's context_length)."""
    from temper.artifacts.engines.decoder_session import DecoderLayout

    context = DecoderLayout.read(base).context_length
    recipe, file = loaded.recipe, str(loaded.file)
    speed, data, quality = recipe.validation.speed, recipe.data, recipe.validation.quality
    for key, tokens in (("data.sequence_length", data.sequence_length),
                        ("data.prompt_tokens", data.prompt_tokens + quality.generation_tokens),
                        ("validate.speed.prompt_length", speed.prompt_length + speed.decode_tokens)):
        if tokens > context:
            raise RecipeError(file, key, f"{tokens} tokens (with the tokens generated after it) exceed the model's "
                              f"context of {context}")


def _source_view(loaded: LoadedDecoder, sequences: list[list[int]],
                 progress: Callable[[str], None]) -> dict[str, list] | None:
    """transformers' NLL and argmax on the sequences (a process of its own), for the export gates; None for an
    ONNX source or with `validate.export: null`."""
    model = loaded.recipe.model
    source = model.hf or model.gguf
    if source is None or loaded.recipe.validation.export is None:
        return None
    progress("baseline: against transformers on the same text")
    with tempfile.TemporaryDirectory(prefix="temper-source-") as work:
        given, result = Path(work) / "sequences.json", Path(work) / "view.json"
        given.write_text(json.dumps(sequences))
        build.run_module(["temper.pipeline.decoders.source_logits", str(loaded.path(source)), str(given),
                          str(result)], "running the source model in transformers", str(loaded.file),
                         "model.hf" if model.hf else "model.gguf")
        view: dict[str, list] = json.loads(result.read_text())
        return view


def run(loaded: LoadedDecoder, output: Path, cache_root: Path, *, use_cache: bool = True,
        require: list[str] | None = None, allow_build_errors: bool = False,
        progress: Callable[[str], None] = lambda _: None) -> DecoderOutcome:
    recipe, file = loaded.recipe, str(loaded.file)
    known = [*recipe.candidates, *loaded.searches]
    for name in require or ():
        if name not in known:
            raise RecipeError(file, "--require", f"no candidate named '{name}'; candidates: {', '.join(known)}")
    if any(spec.weights.method == "nncf" for spec in recipe.candidates.values()):
        from temper.pipeline.quantize_backends.nncf import require as nncf

        nncf()  # not installed: exit 3 before the baseline's export, which takes minutes on a real model
    staged = _staging(output, file)
    try:
        progress("baseline: ONNX Runtime GenAI model builder, FP32")
        base = build.baseline(loaded, cache_root, use_cache=use_cache)
        _fits_context(loaded, base)
        calibrating = any(spec.weights.calibrates for spec in recipe.candidates.values())
        texts = text_set(loaded, base, calibration=calibrating)  # bad text is bad input before any candidate is built
        view = _source_view(loaded, texts.sequences, progress)
        _place(base, staged / "baseline")
        built: dict[str, Built] = {}
        not_built: dict[str, str] = {}
        for name, spec in recipe.candidates.items():
            progress(f"{name}: {spec.weights.method}")
            options = spec.weights
            try:
                folder, kept = build.candidate(base, options, staged / name, texts.calibration)
            except EnvironmentProblem:  # a library not installed (NNCF): exit 3, not one candidate's failure
                raise
            except Exception as exc:  # a library's failure on one candidate: reported, the others go on
                not_built[name] = first_line(exc)
                shutil.rmtree(staged / name, ignore_errors=True)
                continue
            weights = options.model_dump(exclude_unset=True) | {"method": options.method}
            built[name] = Built(folder, weights, options.expected, len(kept), options.backup)
        report = validate(recipe.name, staged / "baseline", built, texts.sequences, texts.prompts,
                          recipe.validation, recipe.select, not_built=not_built, searches=loaded.searches,
                          source_view=view, progress=progress)
        (staged / REPORT).write_text(json.dumps(report.model_dump(mode="json"), indent=2) + "\n")
        mark(staged, recipe=recipe.name)
        if not replaceable(output):  # checked before the build too: something may have moved in since
            raise RecipeError(file, "--output", f"{output} is a folder temper did not write: give a new or empty one")
        swap_in(staged, output)
    finally:
        discard(staged)  # what is left of it when the run stopped before the swap
    passing = {n for n, m in report.candidates.items() if m.passed}
    missed = [n for n in require or () if not ({n} | set(loaded.searches.get(n, ()))) & passing]
    return DecoderOutcome(output, report, missed, [] if allow_build_errors else sorted(not_built))
