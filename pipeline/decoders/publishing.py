"""A decoder run to the registry, as every run is published: one MLflow run (the recipe as params, the gates'
numbers as metrics, the output folder as artifacts) and the selection (a candidate, or the baseline when none
passed) registered as a pyfunc model whose artifact is its model builder folder: the model, its tokenizer and its
generation config (genai_config.json's `search`). `temper serve models:/NAME@ALIAS` serves that folder."""

from __future__ import annotations

import hashlib
from pathlib import Path

from temper.artifacts.core import versions
from temper.artifacts.core.errors import EnvironmentProblem, first_line
from temper.artifacts.formats.integrity import sha256_of
from temper.artifacts.registry.store import Published, StoreUnreachable, open_store, record_run, register
from temper.pipeline.decoders.loading import LoadedDecoder
from temper.pipeline.publishing import TAG_LIMIT, flatten, host_tags
from temper.validators.decoder_report import DecoderReport


def metrics_of(report: DecoderReport) -> dict[str, float]:
    """Perplexity, the quality deltas and the speeds of every model, as MLflow metrics."""
    found = {"baseline.perplexity": report.baseline_perplexity}
    for name, model in {"baseline": report.baseline, **report.candidates}.items():
        found[f"{name}.passed"] = float(model.passed)
        found[f"{name}.size_mb"] = model.size_mb
        if model.quality is not None:
            q = model.quality
            found |= {f"{name}.perplexity": q.perplexity, f"{name}.nll_delta": q.nll_delta,
                      f"{name}.agreement": q.agreement, f"{name}.kl": q.kl}
        if model.speed is not None:
            found |= {f"{name}.ttft_ms": model.speed.ttft_ms,
                      f"{name}.decode_tokens_per_s": model.speed.decode_tokens_per_s}
    return found


def precision_of(weights: dict) -> str:
    """The weights' storage in one word, as the tensor models' `precision` tag: fp32, int8 or int4/int8 blocks."""
    if not weights:
        return "fp32"
    if weights.get("method") == "int8-dynamic":
        return "int8"
    return f"int{weights.get('bits', 4)}-block{weights.get('block_size', 128)}"  # the recipe's defaults


def model_digest(folder: Path) -> str:
    """sha256 over the folder's files' own digests (model, external data, configs, tokenizer), by name: the
    same model published again from the same recipe reuses its version, and a download is checked with it."""
    digest = hashlib.sha256()
    for file in sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")):  # not a marker
        digest.update(f"{file.name}\0{sha256_of(file)}\n".encode())
    return digest.hexdigest()


def publish_decoder(loaded: LoadedDecoder, folder: Path, report: DecoderReport, tracking: str | None) -> Published:
    """Record the run and register its selection; the store failing is the environment (exit 3)."""
    spec = loaded.recipe.publish
    assert spec is not None
    selected = folder / report.selected
    model = report.candidates.get(report.selected, report.baseline)
    recipe_bytes = loaded.file.read_bytes()
    tags = {"kind": "decoder", "recipe": loaded.recipe.name,
            "recipe_sha256": hashlib.sha256(recipe_bytes).hexdigest(), "passed": str(report.passed).lower(),
            "candidate": report.selected, "model_sha256": model_digest(selected),
            "precision": precision_of(model.weights), "weights": str(model.weights or "fp32"),
            "census": str(model.census), "workload": report.workload,
            "gates": (", ".join(f"{g.name}={'pass' if g.passed else 'FAIL'}" for g in model.gates)
                      or f"baseline: {report.selection_reason}")[:TAG_LIMIT],
            **{f"{lib}_version": v for lib, v in versions.current().items()}, **host_tags(report.host)}
    try:
        client = open_store(tracking)
        run_id, model_uri = record_run(
            client, experiment=spec.mlflow.experiment, run_name=spec.mlflow.registered_model,
            params=flatten(loaded.recipe.model_dump(mode="json", by_alias=True)), metrics=metrics_of(report),
            output_folder=folder, tags=tags, bundle=None, decoder=selected)
        assert model_uri is not None  # the decoder was logged
        return register(client, name=spec.mlflow.registered_model, alias=spec.mlflow.alias, run_id=run_id,
                        model_uri=model_uri, tags=tags)
    except StoreUnreachable as exc:
        raise EnvironmentProblem(str(exc)) from exc
    except Exception as exc:  # a tracking server that does not answer, a registry that refuses: environment
        raise EnvironmentProblem(f"publishing to MLflow failed: {first_line(exc)}") from exc
