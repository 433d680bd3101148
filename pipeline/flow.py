"""A recipe's whole job as a library: build, validate, commit the output folder, publish.

The CLI only parses arguments and prints what these return, so a notebook, a test or another
tool gets the same verdict and exit code as `temper run` without going through the CLI.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from temper.artifacts.core.errors import EnvironmentProblem, RecipeError, unwritable
from temper.pipeline.cache import StepCache
from temper.pipeline.loading import LoadedRecipe
from temper.pipeline.runner import Observer, Runner, RunResult

if TYPE_CHECKING:
    from temper.artifacts.registry.store import Published
    from temper.validators.report_model import NotBuilt, Report


@dataclass
class Outcome:
    """What `temper run` (or `validate`) decided. `report` is report.json's model, None when the
    recipe has no validate section (then nothing was gated)."""

    folder: Path
    report: Report | None
    result: RunResult | None = None
    missed: list[str] = field(default_factory=list)  # --require'd candidates that did not pass
    build_errors: list[str] = field(default_factory=list)  # candidates whose build raised, when that counts

    @property
    def exit_code(self) -> int:
        """0 unless a required candidate did not pass or a candidate's build raised an error (temper's,
        a library's or the environment's fault, never a verdict on the model: CI must notice it); without
        gates, unless any candidate failed to build. A build a step rejected (NaN/Inf, a mismatch) is a
        failed gate like any other: the baseline or another candidate is selected, exit 0."""
        if self.report is not None or self.result is None:
            return 1 if self.missed or self.build_errors else 0
        built = {c.name for c in self.result.candidates if not c.error}
        return 0 if built and not self.missed and len(built) == len(self.result.candidates) else 1


def check_required(loaded: LoadedRecipe, names: list[str] | None) -> None:
    """A required name is a candidate, or a searched candidate (then one of its trials must pass)."""
    known = [*loaded.recipe.candidates, *loaded.searches]
    for name in names or ():
        if name not in known:
            raise RecipeError(loaded.file, "--require", f"no candidate named '{name}'; candidates: {', '.join(known)}")


def run(loaded: LoadedRecipe, output: Path, cache: StepCache, *, require: list[str] | None = None,
        tracking: str | None = None, observer: Observer | None = None, allow_build_errors: bool = False,
        committed: list[Path] | None = None, notify: Callable[[str], None] = lambda _: None) -> Outcome:
    """Build the baseline and every candidate, validate them and commit the output folder atomically.

    Everything that needs no candidate (data, providers, metric fit, memory, fidelity slices, the MLflow
    store when the recipe publishes) is checked first, so a bad recipe fails in seconds, not after the
    builds. `allow_build_errors`: a candidate whose build raised does not make the exit code 1 (it is
    still reported, and fails its build gate). `committed` hears the output folder once it is in place,
    `notify` each of `temper check`'s notices (pipeline/check.py) before any candidate is built.
    """
    from temper.pipeline.check import notices
    from temper.pipeline.gating import from_run
    from temper.pipeline.outputs import OutputFolder
    from temper.pipeline.preflight import preflight
    from temper.validators import report
    from temper.validators.validation import build_report, validate

    check_required(loaded, require)
    folder = OutputFolder(output.resolve(), committed)
    try:
        with Runner(loaded, cache, observer) as runner:
            preflight(runner, tracking)  # data and providers, then what the baseline alone can tell
            for line in notices(runner):
                notify(line)
            result = runner.run()
            verdict = None
            if loaded.recipe.validation is not None:
                gated = from_run(runner, result, preflown=True)
                verdict = build_report(validate(gated, runner.observer.note, runner.observer.logged))
                verdict = verdict.model_copy(update={"not_built": not_built(result)})
        target = folder.commit(loaded, result, (lambda d: report.write(verdict, d)) if verdict else None)
    finally:
        folder.discard()
    errors = [] if allow_build_errors else [c.name for c in result.candidates if c.error and c.failure == "error"]
    if verdict is None:
        built = {c.name for c in result.candidates if not c.error}
        return Outcome(target, None, result, [name for name in require or () if name not in built], errors)
    return Outcome(target, verdict, result, required_missed(verdict, require), errors)


def not_built(result: RunResult) -> dict[str, NotBuilt]:
    """report.json's not_built: each candidate that failed to build, whether it raised or was rejected, and why."""
    from temper.validators.report_model import NotBuilt

    return {c.name: NotBuilt(kind="rejected" if c.failure == "rejected" else "error", reason=c.error)
            for c in result.candidates if c.error}


def revalidate(loaded: LoadedRecipe, output: Path, cache: StepCache, *, require: list[str] | None = None,
               observer: Observer | None = None, allow_build_errors: bool = False) -> Outcome:
    """Validate an existing output folder again (new budgets, another host) and replace its reports: the folder
    is staged and swapped in whole, so a failure while writing leaves it as it was."""
    from temper.pipeline.gating import from_folder
    from temper.pipeline.outputs import OutputFolder
    from temper.pipeline.slice_check import check_slices
    from temper.validators import report
    from temper.validators.validation import build_report, validate

    if loaded.recipe.validation is None:
        raise RecipeError(loaded.file, "validate", "this recipe has no validate section: nothing to check")
    check_required(loaded, require)
    with Runner(loaded, cache, observer) as runner:
        subject = from_folder(runner, output)
        folder = OutputFolder.existing(output)  # before the gates run: a folder that cannot be rewritten fails now
        try:
            check_slices(runner, subject.baseline)
            verdict = build_report(validate(subject, runner.observer.note, runner.observer.logged))
            verdict = verdict.model_copy(update={"not_built": _still_not_built(verdict, output)})
            folder.rewrite(lambda staging: report.write(verdict, staging))  # swapped in whole, as `run` commits
        finally:
            folder.discard()
    errors = [] if allow_build_errors else [n for n, f in verdict.not_built.items() if f.kind == "error"]
    return Outcome(output, verdict, None, required_missed(verdict, require), errors)


def _still_not_built(verdict: Report, output: Path) -> dict[str, NotBuilt]:
    """The folder's failed builds as its run classified them (its report.json); one it did not is an error."""
    from temper.validators import report_model

    try:
        earlier = report_model.load(output / report_model.FILE).not_built
    except Exception:  # no report (an ungated run), or one of an older schema
        earlier = {}
    return {name: earlier.get(name) or report_model.NotBuilt(kind="error", reason=gate.detail)
            for name, c in verdict.candidates.items() for gate in c.gates if gate.kind == "build" and not gate.passed}


@dataclass
class Recheck:
    """What `temper validate RECIPE --model URI` re-checked: the registered version, the candidate it
    serves and the library versions the gates held on then and ran on now."""

    uri: str
    candidate: str
    gated_with: dict[str, str]
    now: dict[str, str]
    outcome: Outcome


def revalidate_published(loaded: LoadedRecipe, uri: str, folder: Path, cache: StepCache, *,
                         require: list[str] | None = None, tracking: str | None = None,
                         observer: Observer | None = None) -> Recheck:
    """Re-run a registered version's recorded gates on this host and runtime.

    Downloads the output folder its `temper run` logged (baseline, every candidate, manifest) into `folder`,
    checks the version's model is that run's selection (the model_sha256 tag against the manifest) and every
    file against the manifest, then gates them again with the gates recorded in the manifest (the recipe's
    validate and select sections must equal them), on the evaluation data `loaded` names. The served candidate
    is required: it must still pass (exit 1 otherwise)."""
    from temper.artifacts.core import versions
    from temper.artifacts.formats.integrity import Mismatch, candidate_name, read_manifest, recorded
    from temper.artifacts.registry.store import CannotWrite, FolderInUse, NoSuchModel, StoreUnreachable, fetch_output
    from temper.pipeline.outputs import same_build

    try:
        got = fetch_output(uri, tracking, folder)
    except StoreUnreachable as exc:
        raise EnvironmentProblem(str(exc)) from exc
    except NoSuchModel as exc:
        raise RecipeError(uri, "--model", str(exc)) from exc
    except FolderInUse as exc:
        raise RecipeError(str(folder), "--output", str(exc)) from None
    except CannotWrite as exc:
        raise unwritable(folder, "--output", exc, "the version's run") from exc
    try:
        manifest = read_manifest(got.folder, "publish it again with `temper run`")
    except Mismatch as exc:
        raise RecipeError(uri, "--model", f"its run's {exc.file.name} {exc}") from None
    if not same_build(manifest.get("build_sha256"), loaded.recipe):
        raise RecipeError(loaded.file, "", f"{got.uri} was built from a different model, data or steps than this "
                                           "recipe has: pass the recipe that version was built from")
    try:
        served = candidate_name(manifest, got.tags.get("candidate"))
    except ValueError as exc:
        raise RecipeError(uri, "--model", f"its candidate tag: {exc}: publish it again with `temper run`") from None
    record = recorded(manifest, served) or {}
    if record.get("sha256") != got.tags.get("model_sha256"):
        raise RecipeError(uri, "--model", f"the version's model (sha256 {got.tags.get('model_sha256')}) is not its "
                                          f"run's {served} model: publish it again with `temper run`")
    _same_gates(loaded, manifest["recipe"]["resolved"], got.uri)
    required = [*(require or ()), *([served] if served != "baseline" else [])]
    outcome = revalidate(loaded, got.folder, cache, require=list(dict.fromkeys(required)), observer=observer)
    gated_with = {lib: got.tags[f"{lib}_version"] for lib in versions.TRACKED if f"{lib}_version" in got.tags}
    return Recheck(got.uri, served, gated_with, versions.current(), outcome)


def _same_gates(loaded: LoadedRecipe, published: dict[str, object], uri: str) -> None:
    """The recipe's validate and select sections must be the ones the version was gated with: a re-check runs
    the recorded gates, and changed budgets are a new `temper run`'s question."""
    from temper.pipeline.publishing import flatten

    now = loaded.recipe.model_dump(mode="json", by_alias=True)
    for section in ("validate", "select"):
        then_keys, now_keys = flatten(published.get(section), section), flatten(now.get(section), section)
        differ = sorted(key for key in then_keys.keys() | now_keys.keys() if then_keys.get(key) != now_keys.get(key))
        if differ:
            key = differ[0]
            raise RecipeError(loaded.file, key, f"is {now_keys.get(key)!r} here but {then_keys.get(key)!r} in the "
                                                f"gates {uri} was published with: re-check it with the recipe it was "
                                                "published from (its MLflow run's params); to gate with new budgets, "
                                                "`temper run` or `temper validate --output` a run of your own")


def publish(loaded: LoadedRecipe, outcome: Outcome, tracking: str | None = None) -> Published | None:
    """Publish a gated run when the recipe has a publish section: the selected model, or the baseline
    when no candidate passed (the report says why)."""
    if loaded.recipe.publish is None or outcome.report is None:
        return None
    from temper.pipeline.publishing import publish_run

    return publish_run(loaded, outcome.folder, outcome.report, tracking)


def required_missed(report: Report, require: list[str] | None) -> list[str]:
    """The required candidates with no passing trial (a searched candidate passes when one trial does)."""
    def trials(name: str) -> list[str]:
        return report.searches[name].trials if name in report.searches else [name]

    return [name for name in require or () if not any(report.candidates[n].passed for n in trials(name))]
