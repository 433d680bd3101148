"""What `temper serve MODEL` serves, as artifacts/serving/models.py's Models: one bundle (a run's model, a published or
pulled bundle, models:/...), or a model repository of several; and its model control flags, checked before
anything loads. Kept apart from deploy.py, which parses the flags and runs the servers."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from temper.artifacts.core.errors import EnvironmentProblem, RecipeError, first_line
from temper.pipeline.cli import backups

if TYPE_CHECKING:
    from temper.artifacts.formats.bundle import ServingConfig
    from temper.artifacts.serving.models import Models

PULL_AGAIN = "pull it again with `temper pull`, or rebuild it with `temper run`"
# _located: (model folder, its config or None, why it is unchecked or None, the version to serve)
Located = Callable[[str, "str | None"], AbstractContextManager[tuple[Path, "ServingConfig | None", "str | None", str]]]


def checked_control(model: str, control: str, load_model: list[str]) -> None:
    """The model control flags as Triton takes them: a mode it knows, --load-model only in explicit mode, '*' alone."""
    from temper.artifacts.serving.models import EVERY, MODES

    if control not in MODES:
        raise RecipeError(model, "--model-control-mode", f"must be one of {', '.join(MODES)}, got {control!r}")
    if load_model and control != "explicit":
        raise RecipeError(model, "--load-model", "needs --model-control-mode explicit (in mode none every model of "
                                                 "the repository loads at start), as Triton's does")
    if EVERY in load_model and len(load_model) > 1:
        raise RecipeError(model, "--load-model", "'*' loads every model; give it alone, not with other names")


@contextmanager
def loaded_models(model: str, tracking: str | None, control: str, load_model: list[str], strict: bool,
                  instances: int | None, located: Located, warn: Callable[[str | None], None],
                  fallback_ms: float | None = None) -> Iterator[tuple[Models, str]]:
    """(the Models to serve, a phrase naming what is served). A repository's models are built by the server's
    start-up (their failures end it); a single bundle's Runtime is built here, so a bundle that cannot load is
    one line, exit 2, before any port is served."""
    from temper.artifacts.formats.repository import LoadFailed, ModelRepository, NeedsSchema
    from temper.artifacts.serving.models import EVERY, Models

    path = Path(model)
    if not model.startswith("models:/") and ModelRepository.recognizes(path):
        repository = ModelRepository(path)
        names = repository.names()
        build, fallback = backups.repository_build(model, repository, fallback_ms, warn)
        for name in load_model:
            if name != EVERY and name not in names:
                raise RecipeError(model, "--load-model", f"'{name}' is not a model of the repository (it has: "
                                                         f"{', '.join(names)})")
        at_start = names if control == "none" or EVERY in load_model else load_model
        for name in names:
            _routable_name(str(path / name), name)
        for name in at_start:
            try:
                repository.locate(name)  # an ensemble's steps checked against its composing models too
            except NeedsSchema as exc:  # an ensemble, and no tritonclient to read it with: install the extra
                raise EnvironmentProblem(str(exc)) from None
            except LoadFailed as exc:
                raise RecipeError(str(path / name), "", str(exc)) from None
        models = Models(repository, control, load_model, strict, instances, build=build, notify=warn)
        yield models, (f"the repository {model} ({len(names)} model(s): {', '.join(names)}; model control {control}, "
                       f"{len(at_start)} loaded at start){fallback}")
        return
    with located(model, tracking) as (folder, config, unchecked, version):
        models, what = _single(model, folder, config, unchecked, version, control, load_model, strict, instances, warn)
        if fallback_ms is not None:
            what += backups.with_backup(model, folder, models, instances, fallback_ms)
        yield models, what


def _single(model: str, folder: Path, config: ServingConfig | None, unchecked: str | None, version: str,
            control: str, load_model: list[str], strict: bool, instances: int | None,
            warn: Callable[[str | None], None]) -> tuple[Models, str]:
    import psutil

    from temper.artifacts.formats.bundle import read
    from temper.artifacts.serving.models import EVERY, Models
    from temper.artifacts.serving.runtime import Runtime

    try:
        _routable_name(str(folder / "runtime.json"), (config or read(folder)).name)
    except (OSError, ValueError):
        pass  # an unreadable runtime.json: loading it says what is wrong
    before = psutil.Process().memory_info().rss
    try:
        runtime = Runtime(folder, config=config, instances=instances)
    except EnvironmentProblem:  # this host lacks what the bundle needs (OpenVINO, native BF16): exit 3, not the bundle
        raise
    except Exception as exc:  # an invalid runtime.json, a model onnxruntime cannot load
        raise RecipeError(model, "MODEL", f"cannot load the bundle: {first_line(exc)}; {PULL_AGAIN}") from exc
    growth = max(0, psutil.Process().memory_info().rss - before)
    for warning in (unchecked, runtime.host_warning, runtime.drift_warning):
        warn(warning)  # the root logger is at ERROR without --debug: the log line alone goes unseen
    name = runtime.config.name
    for asked in load_model:
        if asked not in (EVERY, name):
            raise RecipeError(model, "--load-model", f"'{asked}' is not the model this bundle serves ('{name}')")
    models = Models.single(runtime, version, growth, control, strict, warn)
    return models, f"{name} version {version} ({runtime.provider})"


def _routable_name(where: str, name: str) -> None:
    """Refuse, before loading, a model whose name no REST route can reach."""
    from temper.artifacts.serving.protocol import unroutable

    why = unroutable(name)
    if why is not None:
        raise RecipeError(where, "name", f"the model name {why}; /v2/models/NAME/... could never reach it: rename "
                                         "it in the recipe and rebuild")
