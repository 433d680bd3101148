"""What every runtime implements, so that the gates, `temper bench`, `temper serve`, the pyfunc model and the
Triton export ask a runtime, never test which runtime it is.

A runtime (ONNX Runtime, OpenVINO) runs one or more rows of the provider table (artifacts/engines/providers.py).
It says whether a row is available on this host, opens a model with its settings model and checks the live
session really runs where it was asked to, reads those settings back from the session (what a figure
records is what ran, never the request), and names what a bundle selected on it needs: its package and its
Triton backend, instance kind and parameters.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from pydantic import BaseModel

if TYPE_CHECKING:
    from temper.artifacts.core.host import HostProfile
    from temper.artifacts.engines.providers import Provider


class EngineSettings(BaseModel):
    """How a runtime builds a session: what a speed figure was measured with and what serves (runtime.json)."""

    @property
    def threads(self) -> int:
        """CPU threads one inference uses (what the serving runtime divides the cores by)."""
        raise NotImplementedError

    @property
    def precision(self) -> str | None:
        """What the runtime computes float ops in, as the live session reported it; None: as the graph says."""
        return None

    def with_threads(self, count: int) -> EngineSettings:
        """These settings on `count` CPU threads (a host with fewer usable cores than they name)."""
        raise NotImplementedError


class Tensor(Protocol):
    """A session's input or output: ONNX Runtime's NodeArg, or what another runtime gives in its place."""

    @property
    def name(self) -> str: ...


class Session(Protocol):
    """What every model is measured, evaluated and served on: ONNX Runtime's InferenceSession's run interface."""

    def get_inputs(self) -> Sequence[Tensor]: ...

    def get_outputs(self) -> Sequence[Tensor]: ...

    def get_providers(self) -> list[str]: ...

    def run(self, names: list[str] | None, feed: dict[str, np.ndarray]) -> list[np.ndarray]: ...


class Engine(Protocol):
    """One runtime behind the rows of the provider table whose `engine` names it."""

    @property
    def name(self) -> str:
        """The provider table's `engine` value, and Triton's name for the backend."""
        ...

    @property
    def packages(self) -> tuple[str, ...]:
        """What an MLflow model selected on it requires beyond the base requirements."""
        ...

    @property
    def settings(self) -> type[EngineSettings]:
        """Its settings model (runtime.json and report.json `session`)."""
        ...

    def available(self, provider: Provider, host: HostProfile | None = None) -> None:
        """Nothing when this host can run `provider`; EnvironmentProblem (exit 3) in one line saying why not."""
        ...

    def devices(self) -> list[str]:
        """The devices this runtime really offers here (empty when it is not installed)."""
        ...

    def defaults(self, provider: Provider) -> EngineSettings:
        """The settings a model starts from on `provider` on this host."""
        ...

    def open(self, model: Path, provider: Provider, settings: EngineSettings) -> Session:
        """A session on `model` built from `settings`, checked to run on `provider` (EnvironmentProblem if not)."""
        ...

    def settings_of(self, session: Session) -> EngineSettings:
        """The settings a live session really runs with, read back from it."""
        ...

    def serve(self, model: Path, provider: Provider | None, recorded: EngineSettings | None,
              providers: list[str] | None, name: str) -> tuple[Session, Provider, EngineSettings]:
        """The session a bundle serves with: on `provider` (None: the best row this host runs) with the
        `recorded` settings (None: defaults), and the row and settings it really runs with."""
        ...

    def bound_call(self, session: Session, feed: dict[str, np.ndarray], provider: Provider) -> Callable[[], None]:
        """One inference with `feed` placed where the engine reads it once: what the speed loop times."""
        ...

    def search_rows(self, provider: Provider) -> tuple[tuple[str, dict[str, Any]], ...]:
        """The settings the session search tries on `provider`: (name, the fields it changes) each."""
        ...

    def triton(self, provider: Provider, settings: EngineSettings | None) -> dict[str, Any]:
        """Triton model-configuration fields that run a bundle selected on `provider` as it was gated: the
        backend or platform, and the session `parameters` as {key: string value}."""
        ...

    def triton_kind(self, provider: Provider, asked: str) -> str:
        """The instance kind Triton runs `provider`'s bundle with when `asked` (KIND_AUTO, KIND_GPU, KIND_CPU);
        ValueError, completing "BUNDLE was ...", for a kind this runtime cannot run."""
        ...

    def triton_differences(self, provider: Provider, settings: EngineSettings | None = None) -> list[str]:
        """What runs differently on Triton's backend than under `temper serve` for a bundle gated on
        `provider` with `settings`, one phrase each."""
        ...
