"""ONNX Runtime as an engine: its rows are execution providers (cpu, cuda, tensorrt), its settings one model.

The speed gates, evaluation, `temper bench`, `temper serve`, the pyfunc model and the Triton export all build
their ONNX Runtime sessions from a SessionSettings through this module, so the figure a gate measured is a
figure of the session the bundle serves with (runtime.json records the settings).

Intra-op threads sleep rather than spin when idle (`spinning: false`): spinning threads burn every core even
when idle (180-200% CPU at any load on 2 cores), starving the server threads that feed the batcher and, on a
busy host, the other process a gate shares the cores with; the same session measured 1.05-2.9x faster on a
loaded 2-core machine with spinning off.

On a GPU the CUDA arena is bounded and grows by what a call asks for (`gpu_mem_limit_mb`,
`arena_extend_strategy`): ONNX Runtime's defaults take up to the whole device and round every growth up to a
power of two, which starves the neighbouring processes and fragments memory under varying shapes.
With `cuda_graph` the session answers through bound buffers and one CUDA graph per batch size
(artifacts/engines/cuda_graphs.py), a row the session search tries on the GPU rows.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import numpy as np
import onnxruntime as ort
import platformdirs
from pydantic import ConfigDict, Field, PositiveInt, SerializerFunctionWrapHandler, model_serializer

from temper.artifacts.core import native_logs, nvidia
from temper.artifacts.core.errors import EnvironmentProblem
from temper.artifacts.core.host import HostProfile, usable_cores
from temper.artifacts.engines.base import EngineSettings, Session
from temper.artifacts.engines.cuda_graphs import GraphSession
from temper.artifacts.engines.providers import BEST_FIRST, CPU, CUDA, PROVIDERS, TENSORRT, Provider, named

log = logging.getLogger("temper.serving")

SPINNING = "session.intra_op.allow_spinning"  # ONNX Runtime's session config key
GraphLevel = Literal["disable", "basic", "extended", "all"]
LEVELS: dict[str, ort.GraphOptimizationLevel] = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}
ArenaStrategy = Literal["same_as_requested", "next_power_of_two"]
_ARENA = {"same_as_requested": "kSameAsRequested", "next_power_of_two": "kNextPowerOfTwo"}  # the CUDA EP's spelling
Providers = list[str | tuple[str, dict[str, str]]]  # an InferenceSession provider chain
# A GPU bundle's arena limit: the most its gates saw the process hold at any gated batch size (CUDA context
# included, so above the arena's own need), times this headroom for larger serving batches, in STEP_MB steps.
HEADROOM = 1.5
STEP_MB = 64


def needed_limit_mb(peak_mb: float) -> int:
    """The gpu_mem_limit_mb a bundle records when its gates measured `peak_mb` of GPU memory."""
    return int(-(-peak_mb * HEADROOM // STEP_MB) * STEP_MB)


class SessionSettings(EngineSettings):
    """How an ONNX Runtime session is built: what a speed figure was measured with and what serves."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    intra_op_threads: PositiveInt = Field(description="threads inside one operator (chosen per model: all usable "
                                                      "cores or 1, by a batch-1 timing)")
    spinning: bool = Field(False, description="whether idle intra-op threads spin (session.intra_op.allow_spinning)")
    graph_optimization: GraphLevel = Field("all", description="ONNX Runtime's graph optimization level")
    gpu_mem_limit_mb: PositiveInt | None = Field(
        None, description="on cuda/tensorrt, the most MiB the CUDA arena may hold (the EP's gpu_mem_limit); null: "
                          "unbounded, as while the gates measure what the model needs")
    arena_extend_strategy: ArenaStrategy = Field(
        "same_as_requested", description="on cuda/tensorrt, how the CUDA arena grows: by what a call asks for, or "
                                         "to the next power of two (ONNX Runtime's default, which overshoots)")
    cuda_graph: bool = Field(
        False, description="on cuda/tensorrt, capture each batch size's run as a CUDA graph and replay it "
                           "(enable_cuda_graph / trt_cuda_graph_enable), inputs and outputs in bound buffers; "
                           "on the CPU provider the same bound path without a graph")

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """The CUDA arena's fields only where they say something (a GPU session's limit or growth): a CPU
        session's runtime.json and report.json stay as they were."""
        data: dict[str, Any] = handler(self)
        if self.gpu_mem_limit_mb is None:
            data.pop("gpu_mem_limit_mb", None)
        if self.arena_extend_strategy == "same_as_requested":
            data.pop("arena_extend_strategy", None)
        if not self.cuda_graph:
            data.pop("cuda_graph", None)
        return data

    @property
    def threads(self) -> int:
        return self.intra_op_threads

    def with_threads(self, count: int) -> SessionSettings:
        return self.model_copy(update={"intra_op_threads": count})

    def options(self) -> ort.SessionOptions:
        """These settings as ONNX Runtime session options (sequential execution, logging as native_logs says)."""
        options = ort.SessionOptions()
        options.log_severity_level = native_logs.severity()
        options.intra_op_num_threads = self.intra_op_threads
        options.graph_optimization_level = LEVELS[self.graph_optimization]
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.add_session_config_entry(SPINNING, "1" if self.spinning else "0")
        return options

    def cuda_options(self) -> dict[str, str]:
        """The CUDA execution provider's options these settings name (TensorRT's fallback nodes run there too)."""
        options = {"arena_extend_strategy": _ARENA[self.arena_extend_strategy]}
        if self.gpu_mem_limit_mb is not None:
            options["gpu_mem_limit"] = str(self.gpu_mem_limit_mb * 2**20)
        if self.cuda_graph:
            options["enable_cuda_graph"] = "1"
        return options


def engine_cache() -> Path:
    """Where TensorRT engines built on this host are kept: $TEMPER_ENGINE_CACHE, else `engines` in
    the user cache folder platformdirs names (~/.cache/temper/engines on Linux, $XDG_CACHE_HOME
    honoured), the same rule as the pipeline's step cache, so one setting moves both."""
    override = os.environ.get("TEMPER_ENGINE_CACHE")
    return Path(override) if override else platformdirs.user_cache_path("temper", appauthor=False) / "engines"


def tensorrt_cache() -> Path:
    """The engine and timing cache of this host's TensorRT and GPU: engine_cache()/tensorrt-VERSION-smCC, so an
    engine built by another TensorRT or for another compute capability is never loaded."""
    facts = nvidia.read_facts()
    capability = next((c.compute_capability for c in facts.cards if c.compute_capability), None) or "unknown"
    return engine_cache() / f"tensorrt-{facts.tensorrt or 'unknown'}-sm{capability.replace('.', '')}"


def engine_prefix(model: Path) -> str:
    """The TensorRT engine cache prefix of `model`: its bytes' digest, so its engines can be found again."""
    return "temper-" + hashlib.sha256(model.read_bytes()).hexdigest()[:16]


def provider_chain(providers: list[str], settings: SessionSettings | None = None, model: Path | None = None
                   ) -> Providers:
    """ONNX Runtime provider names as a chain with each provider's options: TensorRT builds its engine
    for this GPU on first load and caches it under tensorrt_cache(), named by the model's digest;
    CUDA's arena is bounded as `settings` say."""
    chain: Providers = []
    for name in providers:
        if name == TENSORRT:
            cache = tensorrt_cache()
            cache.mkdir(parents=True, exist_ok=True)
            options = {"trt_engine_cache_enable": "True", "trt_engine_cache_path": str(cache),
                       "trt_timing_cache_enable": "True", "trt_timing_cache_path": str(cache)}
            if model is not None:
                options["trt_engine_cache_prefix"] = engine_prefix(model)
            if settings is not None and settings.cuda_graph:
                options["trt_cuda_graph_enable"] = "True"
            chain.append((name, options))
        elif name == CUDA and settings is not None:
            # behind TensorRT the graph is TensorRT's: one provider captures a session's graph
            cuda = settings.model_copy(update={"cuda_graph": False}) if TENSORRT in providers else settings
            chain.append((name, cuda.cuda_options()))
        else:
            chain.append(name)
    return chain


def open_session(model: Path, settings: SessionSettings, providers: list[str]) -> ort.InferenceSession:
    """A session on `model` built from `settings`, on the provider chain for `providers`. Before a GPU chain,
    the CUDA, cuDNN and TensorRT libraries the pip wheels installed are loaded: on Linux ONNX Runtime does not
    find them on its own (unless a CUDA build of torch was imported first)."""
    if CUDA in providers or TENSORRT in providers:
        _load_gpu_libraries(TENSORRT in providers)
    return ort.InferenceSession(str(model), settings.options(), providers=provider_chain(providers, settings, model))


@functools.cache
def _load_gpu_libraries(tensorrt: bool) -> None:
    """onnxruntime.preload_dlls() (ONNX Runtime >= 1.21) for CUDA and cuDNN; `import tensorrt` for libnvinfer."""
    if tensorrt:
        with contextlib.suppress(ImportError):
            importlib.import_module("tensorrt")  # loads libnvinfer for ONNX Runtime's TensorRT provider
    preload = getattr(ort, "preload_dlls", None)
    if preload is not None:
        with contextlib.suppress(Exception):  # best-effort: the session's own provider check says what failed
            preload()


def settings_of(session: ort.InferenceSession | GraphSession) -> SessionSettings:
    """The settings a live session really runs with, read back from its own options (the CUDA arena's and
    CUDA graphs from the options the CUDA and TensorRT providers report; on the CPU provider, whether calls go
    through the bound path)."""
    options = session.get_session_options()
    level = next(name for name, value in LEVELS.items() if value == options.graph_optimization_level)
    reported = session.get_provider_options()
    cuda = reported.get(CUDA, {})
    if CUDA in reported or TENSORRT in reported:
        graph = cuda.get("enable_cuda_graph") == "1" or \
            reported.get(TENSORRT, {}).get("trt_cuda_graph_enable", "0").lower() in ("1", "true")
    else:
        graph = isinstance(session, GraphSession)
    limit = int(cuda.get("gpu_mem_limit", 0))
    strategy = {v: k for k, v in _ARENA.items()}.get(cuda.get("arena_extend_strategy", ""), "same_as_requested")
    return SessionSettings(intra_op_threads=options.intra_op_num_threads,
                           spinning=options.get_session_config_entry(SPINNING) != "0", graph_optimization=level,
                           gpu_mem_limit_mb=limit // 2**20 if 0 < limit < 2**60 else None,
                           arena_extend_strategy=strategy, cuda_graph=graph)


def graphed(session: ort.InferenceSession, settings: SessionSettings) -> Session:
    """`session` answering through cuda_graphs.GraphSession when `settings` ask for CUDA graphs, on the
    device its first provider runs on."""
    if not settings.cuda_graph:
        return session
    gpu = session.get_providers()[0] in (CUDA, TENSORRT)
    return GraphSession(session, "cuda" if gpu else "cpu")


class OnnxRuntime:
    """ONNX Runtime's rows: its CPU provider, CUDA and TensorRT (CUDA chained after it for what it leaves)."""

    name = "onnxruntime"
    packages: tuple[str, ...] = ()  # the base requirements carry onnxruntime (or onnxruntime-gpu)
    settings = SessionSettings

    def available(self, provider: Provider, host: HostProfile | None = None) -> None:
        """The provider in this onnxruntime's list; on a GPU row first the NVIDIA stack (artifacts/core/nvidia.py: a
        CUDA build, a GPU, a driver at its CUDA's floor and, for tensorrt, the TensorRT its provider links:
        onnxruntime-gpu lists TensorrtExecutionProvider without it and then quietly runs on CUDA or the CPU)."""
        info = PROVIDERS[provider]
        if info.gpu:
            nvidia.require_gpu(provider)
        available = ort.get_available_providers()
        if info.ort not in available:
            raise EnvironmentProblem(f"provider '{provider}' ({info.ort}) requested but this onnxruntime has only "
                                     f"{', '.join(available)}: {info.install}")

    def devices(self) -> list[str]:
        return list(ort.get_available_providers())

    def defaults(self, provider: Provider) -> SessionSettings:
        """All usable cores (CPU affinity and the container's quota), idle threads sleeping, every graph
        optimization; on a GPU, the arena growing by what is asked."""
        return SessionSettings(intra_op_threads=usable_cores())

    def open(self, model: Path, provider: Provider, settings: EngineSettings) -> Session:
        """onnxruntime-gpu falls back to the CPU silently when CUDA's libraries or the GPU are missing, so the
        session's own provider list is checked."""
        assert isinstance(settings, SessionSettings), "ONNX Runtime runs SessionSettings"
        info = PROVIDERS[provider]
        available = ort.get_available_providers()
        session = open_session(model, settings, [info.ort, *(then for then in info.then if then in available)])
        if info.ort not in session.get_providers():
            raise EnvironmentProblem(
                f"provider '{provider}' requested but onnxruntime did not activate {info.ort} (the session has "
                f"{', '.join(session.get_providers())}): check the CUDA/cuDNN/TensorRT libraries this "
                "onnxruntime-gpu needs and that a GPU is visible")
        return graphed(session, settings)

    def settings_of(self, session: Session) -> SessionSettings:
        return settings_of(session)

    def serve(self, model: Path, provider: Provider | None, recorded: EngineSettings | None,
              providers: list[str] | None, name: str) -> tuple[Session, Provider, SessionSettings]:
        """One session on the best provider this host really runs: `providers` as given, else TensorRT, else
        CUDA, else CPU, whichever are available (a bundle stays portable across hosts). TensorRT builds with
        its engine cache; precision comes from the graph (FP16 casts, QDQ), as TensorRT 11 has no precision
        flags. A requested provider the session did not activate is logged, never reported as the engine."""
        settings = recorded if isinstance(recorded, SessionSettings) else self.defaults(provider or "cpu")
        available = ort.get_available_providers()
        if providers is None:
            providers = [PROVIDERS[p].ort for p in BEST_FIRST if p != "cpu" and PROVIDERS[p].ort in available] + [CPU]
        session = open_session(model, settings, providers)
        used = session.get_providers()
        engine = named(used[0] if used else CPU)
        if providers[0] != CPU and used[0] != providers[0]:
            log.warning("%s: %s requested but the session runs on %s", name, providers[0], used)
        log.info("%s: engine=%s providers=%s intra_op_threads=%d spinning=%s cuda_graph=%s", name, engine, used,
                 settings.intra_op_threads, settings.spinning, settings.cuda_graph)
        return graphed(session, settings), engine, settings

    def bound_call(self, session: Session, feed: dict[str, np.ndarray], provider: Provider) -> Callable[[], None]:
        """IO binding: inputs placed on the provider's device once, outputs left there. On a GPU this keeps
        host/device copies out of the timed loop; Run still waits for the CUDA stream at its end (ORT's
        default), so wall time covers the GPU work. A CUDA-graph session replays its graph of the feed's shapes."""
        if isinstance(session, GraphSession):
            return session.bound_call(feed)
        device = "cuda" if PROVIDERS[provider].gpu else "cpu"
        live: Any = session
        binding = live.io_binding()
        for name, array in feed.items():
            contiguous = np.require(array, requirements="C")  # np.ascontiguousarray makes a scalar [1]
            binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(contiguous, device, 0))
        for output in session.get_outputs():
            binding.bind_output(output.name, device, 0)
        binding.synchronize_inputs()
        return lambda: live.run_with_iobinding(binding)

    def search_rows(self, provider: Provider) -> tuple[tuple[str, dict[str, Any]], ...]:
        """On the CPU: one thread, spinning, extended graph optimization. GPU providers take no thread settings:
        there, CUDA graphs off (the default) and on."""
        if PROVIDERS[provider].gpu:
            return (("cuda-graph", {"cuda_graph": True}),)
        return (("one-thread", {"intra_op_threads": 1}), ("spinning", {"spinning": True}),
                ("extended", {"graph_optimization": "extended"}))

    def triton(self, provider: Provider, settings: EngineSettings | None) -> dict[str, Any]:
        """Triton's onnxruntime backend: the graph level, sequential execution and the intra-op thread count
        (it has no setting for spinning, so Triton runs ONNX Runtime's default there, spinning on); on a GPU,
        the CUDA arena's limit and growth as gated."""
        fields: dict[str, Any] = {"platform": "onnxruntime_onnx"}
        if not isinstance(settings, SessionSettings):
            return fields
        parameters = {"intra_op_thread_count": str(settings.intra_op_threads), "execution_mode": "0"}
        if PROVIDERS[provider].gpu:
            parameters["arena_extend_strategy"] = "0" if settings.arena_extend_strategy == "next_power_of_two" else "1"
            if settings.gpu_mem_limit_mb is not None:
                parameters["gpu_mem_limit"] = str(settings.gpu_mem_limit_mb * 2**20)
        fields["optimization"] = {"graph": {"level": TRITON_GRAPH_LEVELS[settings.graph_optimization]}}
        fields["parameters"] = parameters
        return fields

    def triton_kind(self, provider: Provider, asked: str) -> str:
        return asked  # the same ONNX file runs on Triton's CPU or GPU instances

    def triton_differences(self, provider: Provider, settings: EngineSettings | None = None) -> list[str]:
        """CUDA graphs do not carry over: Triton's onnxruntime backend binds each batch's own request buffers
        and runs without `gpu_graph_id`, while a replay reads the addresses it was captured with (its README
        documents `trt_cuda_graph_enable` for TensorRT and none for CUDA), so the export leaves them off."""
        if isinstance(settings, SessionSettings) and settings.cuda_graph and PROVIDERS[provider].gpu:
            return ["no CUDA graphs: Triton's onnxruntime backend binds each batch's own buffers, which a graph "
                    "replay cannot follow, so the export runs the plain path the gates checked it against"]
        return []


# Triton's onnxruntime backend spells the graph optimization level its own way (src/onnxruntime.cc):
# -1 basic, 1 basic + extended, 2 none, anything else (0) all.
TRITON_GRAPH_LEVELS = {"basic": -1, "extended": 1, "disable": 2, "all": 0}
