"""`temper serve` on a decoder LLM: recognises a decoder run's output folder (its selected model), one of its model
folders, or a folder ONNX Runtime GenAI's builder wrote, and serves it with Triton's generate extension
(artifacts/serving/decoder_server.py). Kept apart from serving.py, whose models are tensor bundles."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from temper.artifacts.core.errors import RecipeError, first_line
from temper.pipeline.cli.common import out

REPORT = "report.json"
GENAI_CONFIG = "genai_config.json"


@dataclass(frozen=True)
class DecoderTarget:
    folder: Path  # the builder folder served
    name: str  # the model name routes use: the recipe's
    what: str  # a phrase for the serving line
    version: str = "1"  # the registry's for a models:/ URI


def _decoder_report(output: Path) -> dict | None:
    try:
        report = json.loads((output / REPORT).read_text())
    except (OSError, ValueError):
        return None
    return report if isinstance(report, dict) and report.get("kind") == "decoder" else None


def located(model: str) -> DecoderTarget | None:
    """What `temper serve MODEL` serves when MODEL is a decoder: a run's output folder (report.json's `selected`,
    the baseline when no candidate passed), OUTPUT/CANDIDATE, or a bare builder folder (named after itself);
    None for anything else (a tensor bundle, a repository, models:/...)."""
    if model.startswith("models:/"):
        return None
    path = Path(model).resolve()
    report = _decoder_report(path)
    if report is not None:
        selected = str(report.get("selected", ""))
        folder = path / selected
        if not selected or "/" in selected or not (folder / GENAI_CONFIG).is_file():
            raise RecipeError(str(path / REPORT), "selected", f"{selected!r} is not a model folder of this output")
        return DecoderTarget(folder, str(report["recipe"]), f"{report['recipe']} ({selected}, the run's selection)")
    if not (path / GENAI_CONFIG).is_file():
        return None
    parent = _decoder_report(path.parent)
    if parent is not None:
        known = {"baseline", *parent.get("candidates", {})}
        if path.name not in known:
            raise RecipeError(model, "MODEL", f"'{path.name}' is not the baseline or a candidate of its run's "
                                              f"report.json ({', '.join(sorted(known))})")
        return DecoderTarget(path, str(parent["recipe"]), f"{parent['recipe']} ({path.name})")
    return DecoderTarget(path, path.name, f"{path.name} (a model builder folder)")


def registered_decoder(model: str, tracking: str | None) -> bool:
    """Whether a models:/ URI names a version `temper run` published from a decoder recipe (tag `kind`); an
    unknown name or version is left to the bundle path, which says so in its own words."""
    from temper.artifacts.core.errors import EnvironmentProblem
    from temper.artifacts.registry.store import NoSuchModel, StoreUnreachable, version_tags

    if not model.startswith("models:/"):
        return False
    try:
        return version_tags(model, tracking).get("kind") == "decoder"
    except NoSuchModel:
        return False
    except StoreUnreachable as exc:
        raise EnvironmentProblem(str(exc)) from exc


def checked_download(model: str, folder: Path, tags: dict[str, str]) -> None:
    """A registered decoder's files against the digest its version was registered with (tag model_sha256): a
    damaged or altered copy is one line, exit 2, and never served."""
    from temper.pipeline.decoders.publishing import model_digest

    if model_digest(folder) != tags.get("model_sha256"):
        raise RecipeError(model, "MODEL", "the downloaded model builder folder is not the one registered (its "
                                          "files' sha256 differ from the version's model_sha256 tag): publish it "
                                          "again with `temper run`")


def checked_flags(model: str, grpc_port: int | None, control: str, load_model: list[str],
                  burst_fallback_ms: float | None) -> None:
    """Flags of the tensor server a decoder has no use for: one line each, exit 2, before anything loads."""
    for flag, given in (("--grpc-port", grpc_port is not None), ("--model-control-mode", control != "none"),
                        ("--load-model", bool(load_model)), ("--burst-fallback-ms", burst_fallback_ms is not None)):
        if given:
            raise RecipeError(model, flag, "does not apply to a decoder LLM, which is served over REST with "
                                           "Triton's generate extension alone")


def serve(model: str, target: DecoderTarget, host: str, port: int, instances: int | None) -> None:
    """Load the decoder (a model that cannot load is one line, exit 2, before the port serves) and serve it."""
    from temper.artifacts.serving.decoder_runtime import DecoderModel
    from temper.artifacts.serving.decoder_server import serve as serve_app
    from temper.artifacts.serving.protocol import unroutable
    from temper.pipeline.cli import servers

    why = unroutable(target.name)
    if why is not None:
        raise RecipeError(model, "name", f"the model name {why}; /v2/models/NAME/generate could never reach it")
    sock = servers.listen(model, host, port, None)
    with sock:
        try:
            decoder = DecoderModel(target.folder, target.name, target.version, instances=instances or 1)
        except RecipeError:
            raise
        except Exception as exc:  # a model onnxruntime cannot load, a tokenizer it cannot read
            raise RecipeError(model, "MODEL", f"cannot load the decoder: {first_line(exc)}") from exc
        out.print(f"serving {target.what} at http://{host}:{sock.getsockname()[1]}/v2/models/{target.name}/generate "
                  f"(and /generate_stream) once warm, {decoder.instances} sequence(s) at a time "
                  "(GET /v2/health/ready answers 200); Ctrl-C stops", soft_wrap=True)
        serve_app(decoder, sock)
