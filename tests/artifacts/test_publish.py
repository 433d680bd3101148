"""Publishing the real digits recipe into a real MLflow sqlite store, then pulling and loading it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import mlflow
import numpy as np
import onnxruntime as ort
import pytest
import yaml
from mlflow.tracking import MlflowClient

from tests.conftest import REPO


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("publish-cache")


@pytest.fixture
def digits(digits_dir: Path, shared_cache: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TEMPER_CACHE_DIR", str(shared_cache))
    recipe = digits_dir / "digits-cnn.yaml"
    _edit(recipe, lambda d: d["validate"]["throughput"].update(duration_s=0.6, warmup_s=0.1, min_speedup=0.8))
    return recipe


def _edit(recipe: Path, change) -> None:
    data = yaml.safe_load(recipe.read_text())
    change(data)
    recipe.write_text(yaml.safe_dump(data, sort_keys=False))


def _client(uri: str) -> MlflowClient:
    mlflow.set_tracking_uri(uri)
    return MlflowClient(uri, uri)


def test_publish_registers_the_selected_candidate_once(temper, digits, tmp_path, tracking_store):
    out = tmp_path / "out"
    result = temper("run", digits, "--output", out)
    assert result.code == 0, result.stderr
    assert "published: models:/digits-cnn@candidate -> digits-cnn registered version 1" in result.stdout
    report = json.loads((out / "report.json").read_text())
    client = _client(tracking_store)
    version = client.get_model_version_by_alias("digits-cnn", "candidate")
    assert str(version.version) == "1"
    tags = version.tags
    assert tags["candidate"] == report["selected"]
    assert tags["precision"] in {"fp16", "int8-static", "int8-dynamic"}
    assert tags["model_sha256"] and tags["recipe_sha256"] and tags["onnxruntime_version"]
    assert "accuracy=pass" in tags["gates"]
    run = client.get_run(version.run_id)
    assert run.data.params["model.factory"] == "digits_model.py:build"
    assert f"{report['selected']}.drop" in run.data.metrics
    logged = {a.path for a in client.list_artifacts(version.run_id, "output")}
    assert {"output/report.json", "output/manifest.json", "output/junit.xml"} <= logged

    again = temper("run", digits, "--output", tmp_path / "again")
    assert again.code == 0 and "reused version 1 (same model and recipe)" in again.stdout
    assert len(client.search_model_versions("name='digits-cnn'")) == 1

    # A fresh process (no temper import) loads it by alias and predicts what the ONNX model does.
    images = np.random.default_rng(0).random((5, 1, 8, 8), dtype=np.float32)
    np.save(tmp_path / "x.npy", images)
    script = ("import mlflow, numpy as np, sys\n"
              "m = mlflow.pyfunc.load_model('models:/digits-cnn@candidate')\n"
              "out = m.predict({'pixels': np.load(sys.argv[1])})\n"
              "out = out['logits'] if isinstance(out, dict) else out\n"
              "np.save(sys.argv[2], np.asarray(out))\n")
    env = {**os.environ, "MLFLOW_TRACKING_URI": tracking_store}
    subprocess.run([sys.executable, "-c", script, str(tmp_path / "x.npy"), str(tmp_path / "y.npy")],
                   check=True, env=env, cwd=tmp_path, timeout=300)
    session = ort.InferenceSession(str(out / report["selected"] / "model.onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), session.run(None, {"pixels": images})[0], rtol=1e-5, atol=1e-5)


def test_failing_gate_publishes_nothing(temper, digits, tmp_path, tracking_store):
    _edit(digits, lambda d: d["validate"]["throughput"].update(min_speedup=50.0))
    result = temper("run", digits, "--output", tmp_path / "out")
    assert result.code == 1 and "nothing published" in result.stderr
    assert _client(tracking_store).search_registered_models() == []


def test_promote_and_pull(temper, digits, tmp_path, tracking_store):
    assert temper("run", digits, "--output", tmp_path / "out").code == 0
    promoted = temper("promote", "digits-cnn", "1", "--alias", "champion")
    assert promoted.code == 0
    assert str(_client(tracking_store).get_model_version_by_alias("digits-cnn", "champion").version) == "1"
    assert temper("promote", "digits-cnn", "7", "--alias", "champion").code == 2

    dest = tmp_path / "pulled"
    pulled = temper("pull", "models:/digits-cnn@champion", "--dest", dest)
    assert pulled.code == 0, pulled.stderr
    assert {"model.onnx", "runtime.json", "report.json", "manifest.json"} <= {p.name for p in dest.iterdir()}
    assert "runtime.json" in pulled.stdout
    config = json.loads((dest / "runtime.json").read_text())
    assert config["name"] == "digits-cnn" and config["max_batch_size"] == 16
    assert temper("pull", "models:/digits-cnn@nobody", "--dest", tmp_path / "x").code == 2
