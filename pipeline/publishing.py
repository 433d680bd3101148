"""From a gated run to the registry: the serving bundle, params, metrics and tags MLflow gets."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from temper.artifacts.core import versions
from temper.artifacts.core.errors import EnvironmentProblem, first_line
from temper.artifacts.core.host import HostProfile
from temper.artifacts.formats import bundle
from temper.artifacts.formats.bundle import BACKUP
from temper.artifacts.formats.integrity import sha256_of
from temper.artifacts.registry.store import Published, StoreUnreachable, open_store, record_run, register
from temper.pipeline.cache import MODEL_FILE
from temper.pipeline.loading import LoadedRecipe
from temper.pipeline.outputs import MANIFEST, backup_of, servable, serving_layout
from temper.pipeline.steps import candidate_precision
from temper.validators.report_model import FILE as REPORT_FILE
from temper.validators.report_model import Report, batch_dependent


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Nested recipe -> dotted keys, the shape MLflow params take."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out |= flatten(item, f"{prefix}.{key}" if prefix else str(key))
        return out
    return {prefix: value}


def metrics_of(report: Report | Mapping[str, Any]) -> dict[str, float]:
    """The report's numbers as MLflow metrics (report.json's dict is validated on the way in)."""
    report = Report.model_validate(report)
    found: dict[str, float] = {}
    if report.baseline.metric is not None:
        found[f"baseline.{report.metric}"] = report.baseline.metric
    for m in report.baseline.throughput:
        found[f"baseline.{m.provider}.b{m.batch_size}.samples_per_s"] = m.samples_per_s
    for key, c in report.candidates.items():
        name = key.replace("@", "/")  # a pair on another engine, model@engine: MLflow refuses @ in a metric name
        found[f"{name}.passed"] = float(c.passed)
        if c.metric is not None and c.drop is not None:
            found[f"{name}.{report.metric}"] = c.metric
            found[f"{name}.drop"] = c.drop
        for f in c.fidelity:
            found[f"{name}.fidelity.{f.name}.cosine"] = f.cosine
            found[f"{name}.fidelity.{f.name}.max_abs"] = f.max_abs
        for cm in c.throughput:
            key = f"{name}.{cm.provider}.b{cm.batch_size}"
            found[f"{key}.samples_per_s"] = cm.samples_per_s
            found[f"{key}.speedup"] = cm.speedup
            found[f"{key}.p99_ms"] = cm.latency_ms.p99
    return found


def publish_run(loaded: LoadedRecipe, folder: Path, report: Report | Mapping[str, Any],
                tracking: str | None) -> Published:
    """Record the run in MLflow and register the selection (the baseline when no candidate passed) with
    its serving runtime."""
    spec = loaded.recipe.publish
    assert spec is not None
    report = Report.model_validate(report)
    selected = report.selected
    host = report.host
    tags = {"recipe": loaded.recipe.name, "recipe_sha256": loaded.sha256, "passed": str(report.passed).lower(),
            **{f"{lib}_version": v for lib, v in versions.current().items()},
            **host_tags(host)}
    try:
        client = open_store(tracking)
        with tempfile.TemporaryDirectory() as tmp:
            model = folder / selected / MODEL_FILE
            tags |= _version_tags(loaded, report, selected, model)
            layout = serving_layout(json.loads((folder / MANIFEST).read_text()))
            config = bundle.config_for(model, spec.mlflow.registered_model, layout, measured_on=host,
                                       engine=report.selected_engine,
                                       session=report.session_of(report.selected_pair), gated_with=versions.current(),
                                       batch_dependent=batch_dependent(report, report.selected_pair),
                                       **spec.serving.model_dump())
            packed = bundle.write(Path(tmp) / "bundle", model, config, [folder / REPORT_FILE, folder / MANIFEST])
            _pack_backup(folder, packed)
            run_id, model_uri = record_run(
                client, experiment=spec.mlflow.experiment, run_name=spec.mlflow.registered_model,
                params=flatten(loaded.recipe.model_dump(mode="json", by_alias=True)), metrics=metrics_of(report),
                output_folder=folder, tags=tags, bundle=packed)
        assert model_uri is not None  # a bundle was logged
        return register(client, name=spec.mlflow.registered_model, alias=spec.mlflow.alias, run_id=run_id,
                        model_uri=model_uri, tags=tags)
    except StoreUnreachable as exc:
        raise EnvironmentProblem(str(exc)) from exc
    except Exception as exc:  # an unreachable tracking server, a registry that refuses: environment
        raise EnvironmentProblem(f"publishing to MLflow failed: {first_line(exc)}") from exc


def _pack_backup(folder: Path, packed: Path) -> str | None:
    """Write the burst fallback's backup model (artifacts/serving/fallback.py) into the bundle's backup/ folder: the
    fastest other pair that passed every gate on the selected engine (pipeline/outputs.py backup_of), with the
    serving options publishing gives the selected one, so `temper serve models:/NAME@ALIAS --burst-fallback-ms`
    has it. None (and no folder) when no other pair passed; servable() checks its file against the manifest."""
    name = backup_of(folder)
    if name is None:
        return None
    source, config = servable(folder / name)
    assert config is not None  # a model in a run's output folder, never a bundle
    bundle.write(packed / BACKUP, source / MODEL_FILE, config)
    return name


TAG_LIMIT = 5000  # MLflow's longest tag value


def host_tags(host: HostProfile) -> dict[str, str]:
    """The measuring host as MLflow tags, so a registry search can filter versions by where they were gated."""
    return {"host.cpu": host.cpu, "host.arch": host.arch,
            "host.features": " ".join(host.features) if host.features_known else "unknown",
            "host.vnni": str(host.vnni).lower(), "host.usable_cores": str(host.usable_cores),
            "host.gpus": ", ".join(g.name for g in host.gpus) or "none", "host.summary": host.summary()}


def _version_tags(loaded: LoadedRecipe, report: Report, selected: str, model: Path) -> dict[str, str]:
    candidate = report.candidates.get(report.selected_pair)
    gates = candidate.gates if candidate else []
    return {
        "candidate": selected,
        # what the graph is (validators/census.py), never what the recipe's steps meant it to be
        "precision": (candidate.precision if candidate and candidate.precision
                      else candidate_precision(loaded.recipe, selected)),
        "provider": report.selected_engine,
        "engine_precision": (candidate.engine_precision if candidate else None) or "graph",
        "model_sha256": sha256_of(model),
        "gates": (", ".join(f"{g.name}={'pass' if g.passed else 'FAIL'}" for g in gates)
                  or f"baseline: {report.selection_reason}")[:TAG_LIMIT],
    }
