"""From a gated run to the registry: the serving bundle, params, metrics and tags MLflow gets."""

from __future__ import annotations

import importlib.metadata
import tempfile
from pathlib import Path
from typing import Any

from artifacts import bundle
from artifacts.registry import Published, connect, publish
from pipeline.cache import MODEL_FILE
from pipeline.errors import EnvironmentProblem, first_line
from pipeline.loading import LoadedRecipe
from pipeline.onnx_io import sha256_file
from pipeline.outputs import MANIFEST


def precision(loaded: LoadedRecipe, candidate: str) -> str:
    """fp32, fp16, int8-static or int8-dynamic: what the candidate's steps made of the baseline."""
    label = "fp32"
    for step in loaded.recipe.candidates[candidate].steps:
        if step.name == "quantize":
            label = f"int8-{step.options.mode}"
        elif step.name == "fp16" and label == "fp32":
            label = "fp16"
    return label


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Nested recipe -> dotted keys, the shape MLflow params take."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out |= flatten(item, f"{prefix}.{key}" if prefix else str(key))
        return out
    return {prefix: value}


def metrics_of(report: dict[str, Any]) -> dict[str, float]:
    found: dict[str, float] = {}
    if report["baseline"]["metric"] is not None:
        found[f"baseline.{report['metric']}"] = report["baseline"]["metric"]
    for m in report["baseline"]["throughput"]:
        found[f"baseline.{m['provider']}.b{m['batch_size']}.samples_per_s"] = m["samples_per_s"]
    for name, c in report["candidates"].items():
        found[f"{name}.passed"] = float(c["passed"])
        if c["metric"] is not None:
            found[f"{name}.{report['metric']}"] = c["metric"]
            found[f"{name}.drop"] = c["drop"]
        for f in c["fidelity"]:
            found[f"{name}.fidelity.{f['name']}.cosine"] = f["cosine"]
            found[f"{name}.fidelity.{f['name']}.max_abs"] = f["max_abs"]
        for m in c["throughput"]:
            key = f"{name}.{m['provider']}.b{m['batch_size']}"
            found[f"{key}.samples_per_s"] = m["samples_per_s"]
            found[f"{key}.speedup"] = m["speedup"]
            found[f"{key}.p99_ms"] = m["latency_ms"]["p99"]
    return found


def publish_selected(loaded: LoadedRecipe, folder: Path, report: dict[str, Any], tracking: str | None) -> Published:
    """Register the selected candidate of a passed run, with its serving runtime configuration."""
    spec = loaded.recipe.publish
    selected = report["selected"]
    assert spec is not None and selected is not None
    model = folder / selected / MODEL_FILE
    gates = report["candidates"][selected]["gates"]
    validated_on = loaded.recipe.validation.throughput.providers[0] if loaded.recipe.validation.throughput else "cpu"
    tags = {
        "candidate": selected,
        "precision": precision(loaded, selected),
        "provider": validated_on,
        "recipe": loaded.recipe.name,
        "recipe_sha256": loaded.sha256,
        "model_sha256": sha256_file(model),
        "gates": ", ".join(f"{g['name']}={'pass' if g['passed'] else 'FAIL'}" for g in gates),
        **{f"{lib}_version": importlib.metadata.version(lib) for lib in ("onnxruntime", "onnx", "temper-ml")},
    }
    config = bundle.config_for(model, spec.mlflow.registered_model, **spec.serving.model_dump())
    try:
        client = connect(tracking)
        with tempfile.TemporaryDirectory() as tmp:
            packed = bundle.write(Path(tmp) / "bundle", model, config, [folder / "report.json", folder / MANIFEST])
            return publish(client, experiment=spec.mlflow.experiment, name=spec.mlflow.registered_model,
                           alias=spec.mlflow.alias, params=flatten(loaded.recipe.model_dump(mode="json", by_alias=True)), metrics=metrics_of(report),
                           output_folder=folder, bundle=packed, tags=tags)
    except Exception as exc:  # an unreachable tracking server, a registry that refuses: environment
        raise EnvironmentProblem(f"publishing to MLflow failed: {first_line(exc)}") from exc
