"""The one definition of the ONNX Runtime session a model runs with.

The speed gates, evaluation, `temper bench`, `temper serve`, the pyfunc model and the Triton export
all build their sessions from a SessionSettings through this module, so the figure a gate measured
is a figure of the session the bundle serves with (runtime.json records the settings). It lives in
artifacts/, the bottom layer, because the serving runtime and the MLflow model ship only artifacts/.

Intra-op threads sleep rather than spin when idle (`spinning: false`): spinning threads burn every
core even when idle (180-200% CPU at any load on 2 cores), starving the server threads that feed
the batcher and, on a busy host, the other process a gate shares the cores with; the same session
measured 1.05-2.9x faster on a loaded 2-core machine with spinning off.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

import onnxruntime as ort
import platformdirs
from pydantic import BaseModel, ConfigDict, Field, PositiveInt

from temper.artifacts.providers import TENSORRT

SPINNING = "session.intra_op.allow_spinning"  # ONNX Runtime's session config key
GraphLevel = Literal["disable", "basic", "extended", "all"]
LEVELS: dict[str, ort.GraphOptimizationLevel] = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}
Providers = list[str | tuple[str, dict[str, str]]]  # an InferenceSession provider chain


class SessionSettings(BaseModel):
    """How an ONNX Runtime session is built: what a speed figure was measured with and what serves."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    intra_op_threads: PositiveInt = Field(description="threads inside one operator (chosen per model: all usable "
                                                      "cores or 1, by a batch-1 timing)")
    spinning: bool = Field(False, description="whether idle intra-op threads spin (session.intra_op.allow_spinning)")
    graph_optimization: GraphLevel = Field("all", description="ONNX Runtime's graph optimization level")

    def options(self) -> ort.SessionOptions:
        """These settings as ONNX Runtime session options (sequential execution, warnings and above logged)."""
        options = ort.SessionOptions()
        options.log_severity_level = 3
        options.intra_op_num_threads = self.intra_op_threads
        options.graph_optimization_level = LEVELS[self.graph_optimization]
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.add_session_config_entry(SPINNING, "1" if self.spinning else "0")
        return options


def engine_cache() -> Path:
    """Where TensorRT engines built on this host are kept: $TEMPER_ENGINE_CACHE, else `engines` in
    the user cache folder platformdirs names (~/.cache/temper/engines on Linux, $XDG_CACHE_HOME
    honoured), the same rule as the pipeline's step cache, so one setting moves both."""
    override = os.environ.get("TEMPER_ENGINE_CACHE")
    return Path(override) if override else platformdirs.user_cache_path("temper", appauthor=False) / "engines"


def provider_chain(providers: list[str]) -> Providers:
    """ONNX Runtime provider names as a chain with each provider's options: TensorRT builds its engine
    for this GPU on first load and caches it (keyed by TensorRT version and GPU) under engine_cache()."""
    chain: Providers = []
    for name in providers:
        if name == TENSORRT:
            engine_cache().mkdir(parents=True, exist_ok=True)
            chain.append((name, {"trt_engine_cache_enable": "True", "trt_engine_cache_path": str(engine_cache())}))
        else:
            chain.append(name)
    return chain


def open_session(model: Path, settings: SessionSettings, providers: list[str]) -> ort.InferenceSession:
    """A session on `model` built from `settings`, on the provider chain for `providers`."""
    return ort.InferenceSession(str(model), settings.options(), providers=provider_chain(providers))


def settings_of(session: ort.InferenceSession) -> SessionSettings:
    """The settings a live session really runs with, read back from its own options."""
    options = session.get_session_options()
    level = next(name for name, value in LEVELS.items() if value == options.graph_optimization_level)
    return SessionSettings(intra_op_threads=options.intra_op_num_threads,
                           spinning=options.get_session_config_entry(SPINNING) != "0", graph_optimization=level)
