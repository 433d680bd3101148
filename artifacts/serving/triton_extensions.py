"""Triton's model configuration (`/v2/models/<name>/config`) and statistics (`/v2/models/<name>/stats`)
extensions, as the JSON bodies the REST server answers with.

They are documents built from the Runtime (its config, engine and counters), not request handling,
so they live apart from the server; tritonclient's get_model_config and get_inference_statistics
read them unchanged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from temper.artifacts import engines
from temper.artifacts.engines.providers import PROVIDERS
from temper.artifacts.formats.ensemble import PLATFORM as ENSEMBLE
from temper.artifacts.serving.ensemble_runtime import Ensemble
from temper.artifacts.serving.protocol import VERSION
from temper.artifacts.serving.runtime import Runtime
from temper.artifacts.triton.config import _model_config

if TYPE_CHECKING:
    from temper.artifacts.serving.models import Loaded

PLATFORM = "onnxruntime_onnx"  # Triton's name for what runs the model
EXTENSIONS = ["binary_tensor_data", "model_configuration", "model_repository", "statistics",  # what both list
              "system_shared_memory"]  # listed as Triton does, also while --allow-client-shm is off


def platform(runtime: Runtime | Ensemble) -> str:
    """What model metadata names as the model's platform: Triton's `onnxruntime_onnx`, or `openvino` for a
    bundle served on OpenVINO (Triton reports its backend's name there), `ensemble` for an ensemble."""
    if isinstance(runtime, Ensemble):
        return ENSEMBLE
    fields = engines.of(runtime.provider).triton(runtime.provider, None)
    return str(fields.get("backend", fields.get("platform", PLATFORM)))


def model_config(runtime: Runtime | Ensemble) -> dict[str, Any]:
    """Triton's model configuration (the JSON form of its ModelConfig), as `temper export-triton`
    writes it for this bundle, with the instances this server really runs: its worker processes, or the
    one in-process session (instances 0; before start() has chosen a default, 1). An ensemble's is its
    config.pbtxt as parsed."""
    if isinstance(runtime, Ensemble):
        return dict(runtime.spec.document)
    engine = engines.of(runtime.provider)
    kind = engine.triton_kind(runtime.provider, "KIND_GPU" if PROVIDERS[runtime.provider].gpu else "KIND_CPU")
    config = _model_config(runtime.config, runtime.instances or 1, kind,
                           engine.triton(runtime.provider, runtime.config.session))
    config.pop("model_warmup", None)  # a repository setting; this server has warmed up already
    return {"backend": engine.name, **config}


def statistics(runtime: Runtime | Ensemble, refused: int, version: str = VERSION, memory_bytes: int | None = None,
               gpu_bytes: int | None = None) -> dict[str, Any]:
    """Triton's statistics extension for one model. Counts are requests, times are summed
    per request (a request in a batch of 8 adds the whole batch's compute), as Triton does;
    batch_stats count executions per batch size. fail adds the `refused` requests the server
    turned away before they reached the runtime. `memory_bytes` (artifacts/serving/models.py says how it is
    measured) becomes Triton's memory_usage, one CPU entry, and `gpu_bytes` a GPU entry for a model on a GPU."""
    m = runtime.metrics.snapshot()
    executed = m["executed_requests"]

    def duration(count: int, ns: int) -> dict[str, int]:
        return {"count": count, "ns": ns}

    model = {
        "name": runtime.config.name, "version": version, "last_inference": m["last_inference_ms"],
        "inference_count": m["inference_count"], "execution_count": m["execution_count"],
        "inference_stats": {
            "success": duration(m["request_success"], m["success_ns"]),
            "fail": duration(m["request_failure"] + refused, m["failure_ns"]),
            "queue": duration(executed, m["queue_ns"]),
            "compute_input": duration(executed, m["compute_input_ns"]),
            "compute_infer": duration(executed, m["compute_ns"]),
            "compute_output": duration(executed, m["compute_output_ns"]),
            "cache_hit": duration(0, 0), "cache_miss": duration(0, 0),
        },
        "batch_stats": [
            {"batch_size": rows, "compute_input": duration(count, input_ns),
             "compute_infer": duration(count, infer_ns), "compute_output": duration(count, output_ns)}
            for rows, (count, input_ns, infer_ns, output_ns) in m["batches"].items()
        ],
        "memory_usage": ([] if memory_bytes is None else [{"type": "CPU", "id": 0, "byte_size": memory_bytes}])
        + ([] if gpu_bytes is None else [{"type": "GPU", "id": 0, "byte_size": gpu_bytes}]),
    }
    return {"model_stats": [model]}


def every_statistics(models: list[Loaded]) -> dict[str, Any]:
    """The statistics of every model loaded, as Triton answers a request naming none."""
    return {"model_stats": [model_statistics(m)["model_stats"][0] for m in models]}


def model_statistics(model: Loaded) -> dict[str, Any]:
    return statistics(model.runtime, model.refused, model.version, model.memory()[0], model.gpu_memory())
