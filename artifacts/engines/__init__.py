"""The engines a model may be gated and served on: the runtimes (artifacts/engines/base.py's protocol) and
the provider table's rows they run (artifacts/engines/providers.py).

Every layer asks `of(provider)` for the runtime behind a row and calls the protocol; nothing outside this
package tests which runtime a row is. A new runtime is its module here, its entry in ENGINES and in
Settings, its rows in providers.py and its extra in pyproject.toml (CONTRIBUTING's table).
It sits in artifacts/, the bottom layer, because the serving runtime and the MLflow model ship only artifacts/.
"""

from __future__ import annotations

from temper.artifacts.engines.base import Engine, EngineSettings, Session
from temper.artifacts.engines.cuda_graphs import replay_problem, uses_graphs
from temper.artifacts.engines.onnxruntime import OnnxRuntime, SessionSettings
from temper.artifacts.engines.openvino import OpenVino, OpenVinoSettings
from temper.artifacts.engines.providers import PROVIDERS, EngineName

# Each runtime's settings model, as report.json, runtime.json and the worker spec hold them.
Settings = SessionSettings | OpenVinoSettings
ENGINES: dict[EngineName, Engine] = {"onnxruntime": OnnxRuntime(), "openvino": OpenVino()}

__all__ = ["ENGINES", "Engine", "EngineSettings", "Session", "Settings", "of", "replay_problem", "uses_graphs"]


def of(provider: str) -> Engine:
    """The runtime that runs `provider`'s row (ValueError naming the table for an unknown row)."""
    if provider not in PROVIDERS:
        raise ValueError(f"unknown provider '{provider}'; choose from {', '.join(PROVIDERS)}")
    return ENGINES[PROVIDERS[provider].engine]


def parse(provider: str | None, recorded: dict | EngineSettings | None) -> EngineSettings | None:
    """Recorded settings (a dict from JSON, or a model) as the settings model of `provider`'s runtime; None when
    nothing was recorded or it was recorded for another runtime."""
    if recorded is None:
        return None
    engine = of(provider or "cpu")
    if isinstance(recorded, EngineSettings):
        return recorded if isinstance(recorded, engine.settings) else None
    return engine.settings.model_validate(recorded)
