"""A decoder run published to a real MLflow sqlite store: the selection registered once with its tokenizer and
generation config, loadable as a pyfunc that generates what the greedy loop gives, and `temper serve
models:/NAME@ALIAS` answering the generate extension with the same text."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import mlflow
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from tests.artifacts.servers import Client, _temper_serve
from tests.artifacts.test_decoder_serve import _expected, _generate
from tests.helpers import REPO, CliResult
from tests.pipeline.decoders.tiny import tiny_llama, write_recipe

pytestmark = pytest.mark.slow


def test_a_decoder_is_published_once_and_served_from_the_registry(
        temper: Callable[..., CliResult], tmp_path: Path, tracking_store: str) -> None:
    recipe = write_recipe(tmp_path / "recipe.yaml", tiny_llama(tmp_path / "hf"),
                          candidates={"q8": {"weights": {"method": "matmul-nbits", "bits": 8, "block_size": 32}}},
                          publish={"mlflow": {"registered_model": "tiny-llm", "alias": "champion"}})
    result = temper("run", recipe, "--output", tmp_path / "out")
    assert result.code == 0, result.stdout + result.stderr
    assert "published: models:/tiny-llm@champion -> tiny-llm registered version 1" in result.stdout
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    selected = tmp_path / "out" / report["selected"]

    mlflow.set_tracking_uri(tracking_store)
    version = MlflowClient(tracking_store, tracking_store).get_model_version_by_alias("tiny-llm", "champion")
    assert version.tags["kind"] == "decoder" and version.tags["candidate"] == report["selected"]
    assert version.tags["precision"] == {"baseline": "fp32", "q8": "int8-block32"}[report["selected"]]
    local = Path(mlflow.artifacts.download_artifacts(artifact_uri="models:/tiny-llm/1", dst_path=str(tmp_path / "dl")))
    shipped = {p.name for p in local.rglob("*") if p.is_file()}
    assert {"tokenizer.json", "tokenizer_config.json", "genai_config.json", "model.onnx", "model.onnx.data"} <= shipped
    config = next(local.rglob("genai_config.json"))
    assert json.loads(config.read_text())["search"]["do_sample"] is False  # the generation config travels

    model = mlflow.pyfunc.load_model("models:/tiny-llm@champion")
    answers = model.predict(pd.DataFrame({"text_input": ["the movie was", "café"], "max_tokens": [12, 5]}))
    assert list(answers["text_output"]) == [_expected(selected, "the movie was", 12), _expected(selected, "café", 5)]

    again = temper("run", recipe, "--output", tmp_path / "out")
    assert again.code == 0 and "reused version 1 (same model and recipe)" in again.stdout, again.stdout

    with _temper_serve("models:/tiny-llm@champion") as (port, printed):
        client = Client(port)
        answer = _generate(client, "the movie was", 12, model="tiny-llm")
        client.close()
    assert answer == {"model_name": "tiny-llm", "model_version": "1",
                      "text_output": _expected(selected, "the movie was", 12)}
    assert f"tiny-llm version 1 ({report['selected']})" in printed["stdout"]

    for stored in Path(tracking_store.removeprefix("sqlite:///")).parent.rglob("tokenizer.json"):
        stored.write_text(stored.read_text().replace('"<unk>"', '"<UNK>"'))  # the registry's copies altered
    code = "import sys; from temper.pipeline.cli import main; sys.argv[0] = 'temper'; main()"
    done = subprocess.run([sys.executable, "-c", code, "serve", "models:/tiny-llm@champion"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "not the one registered" in done.stderr, done.stderr
