"""Publishing the real digits recipe into a real MLflow sqlite store, then pulling and loading it."""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import numpy as np
import onnxruntime as ort
import pytest
from mlflow.tracking import MlflowClient

from tests.helpers import edit_recipe


def _client(uri: str) -> MlflowClient:
    mlflow.set_tracking_uri(uri)
    return MlflowClient(uri, uri)


def _by_size_without_a_speed_gate(recipe: Path) -> None:
    """Select by size, which noise cannot change, with no speed gate: every candidate that keeps accuracy and
    fidelity passes, so a run selects the same model twice and the selection has peers."""
    edit_recipe(recipe, lambda d: (d.update(select="smallest-passing"), d["validate"]["throughput"].pop("min_speedup"),
                                   d["validate"]["throughput"].pop("speedup_at")))


@pytest.mark.slow
def test_publish_registers_the_selected_candidate_once(temper, gated_digits, tmp_path, tracking_store):
    # Reuse needs both runs to select the same model: by size, which noise cannot change (a speed
    # selection on a busy host may pick another candidate the second time, and rightly publish it anew).
    _by_size_without_a_speed_gate(gated_digits)
    out = tmp_path / "out"
    result = temper("run", gated_digits, "--output", out)
    assert result.code == 0, result.stderr
    assert "published: models:/digits-cnn@candidate -> digits-cnn registered version 1" in result.stdout
    report = json.loads((out / "report.json").read_text())
    client = _client(tracking_store)
    version = client.get_model_version_by_alias("digits-cnn", "candidate")
    assert str(version.version) == "1"
    tags = version.tags
    selected = report["selected"]
    assert tags["candidate"] == selected
    # A candidate is published only when it beat the baseline on its speedup interval (the selection
    # rule); on a loaded host that may not hold, and then the FP32 baseline is, with its reason.
    if selected == "baseline":
        assert tags["precision"] == "fp32" and tags["gates"] == f"baseline: {report['selection_reason']}"
    else:
        assert tags["precision"] == report["candidates"][selected]["precision"]
        assert "accuracy=pass" in tags["gates"]
    assert tags["model_sha256"] and tags["recipe_sha256"] and tags["onnxruntime_version"]
    run = client.get_run(version.run_id)
    assert run.data.params["model.factory"] == "digits_model.py:build"
    assert f"{report['selected']}.drop" in run.data.metrics
    logged = {a.path for a in client.list_artifacts(version.run_id, "output")}
    assert {"output/report.json", "output/manifest.json", "output/junit.xml"} <= logged

    again = temper("run", gated_digits, "--output", tmp_path / "again")
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
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), session.run(None, {"pixels": images})[0],
                               rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_when_no_candidate_passes_the_baseline_is_published_with_the_reason(temper, gated_digits, tmp_path,
                                                                            tracking_store):
    edit_recipe(gated_digits, lambda d: d["validate"]["throughput"].update(min_speedup=50.0))
    result = temper("run", gated_digits, "--output", tmp_path / "out")
    assert result.code == 0, result.stderr
    assert "(the FP32 baseline: no candidate passed)" in result.stdout
    client = _client(tracking_store)
    version = client.get_model_version_by_alias("digits-cnn", "candidate")
    assert version.tags["candidate"] == "baseline" and version.tags["precision"] == "fp32"
    assert version.tags["gates"].startswith("baseline: no candidate passed every gate")
    runs = client.search_runs([client.get_experiment_by_name("temper").experiment_id])
    assert len(runs) == 1 and runs[0].data.tags["temper.passed"] == "false"  # no candidate passed
    assert "int8-dynamic.cpu.b32.speedup" in runs[0].data.metrics


@pytest.mark.slow
def test_the_measuring_host_travels_with_the_published_model(temper, gated_digits, tmp_path, tracking_store):
    from temper.artifacts.core.host import profile

    out = tmp_path / "out"
    assert temper("run", gated_digits, "--output", out).code == 0
    host = profile()
    report = json.loads((out / "report.json").read_text())
    manifest = json.loads((out / "manifest.json").read_text())
    assert report["host"]["cpu"] == manifest["host"]["cpu"] == host.cpu
    assert report["host"]["features"] == host.features
    client = _client(tracking_store)
    version = client.get_model_version_by_alias("digits-cnn", "candidate")
    assert version.tags["host.cpu"] == host.cpu and version.tags["host.vnni"] == str(host.vnni).lower()
    assert client.get_run(version.run_id).data.tags["temper.host.features"] == " ".join(host.features)
    pulled = tmp_path / "pulled"
    assert temper("pull", "models:/digits-cnn@candidate", "--dest", pulled).code == 0
    runtime = json.loads((pulled / "runtime.json").read_text())
    assert runtime["measured_on"] == report["host"]


@pytest.mark.slow
def test_promote_and_pull(temper, gated_digits, tmp_path, tracking_store):
    assert temper("run", gated_digits, "--output", tmp_path / "out").code == 0
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

    # The pulled folder is all a serving team needs: Triton export and temper serve, no registry.
    exported = temper("export-triton", dest, "--dest", tmp_path / "repo")
    assert exported.code == 0, exported.stderr
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    parsed = text_format.Parse((tmp_path / "repo" / "digits-cnn" / "config.pbtxt").read_text(),
                               model_config_pb2.ModelConfig())
    assert parsed.max_batch_size == 16 and parsed.dynamic_batching.max_queue_delay_microseconds == 10_000
    _serve_and_check(dest, tmp_path)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_until_ok(port: int, path: str, seconds: float) -> bool:
    """Poll GET path until it answers 200 (True) or the time is up (False)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", path)
            if conn.getresponse().status == 200:
                return True
        except OSError:
            time.sleep(0.3)
    return False


def _serve_and_check(bundle: Path, tmp_path: Path) -> None:
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    server = subprocess.Popen([str(Path(sys.executable).parent / "temper"), "serve", str(bundle), "--port", str(port)],
                              env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        if not _wait_until_ok(port, "/v2/health/ready", 60):
            raise AssertionError("server never became ready: "
                                 f"{server.stderr.read1().decode() if server.poll() is not None else ''}")
        image = np.random.default_rng(1).random((1, 1, 8, 8), dtype=np.float32)
        body = json.dumps({"inputs": [{"name": "pixels", "shape": [1, 1, 8, 8], "datatype": "FP32",
                                       "data": image.ravel().tolist()}]})
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("POST", "/v2/models/digits-cnn/infer", body, {"Content-Type": "application/json"})
        reply = json.loads(conn.getresponse().read())
        got = np.asarray(reply["outputs"][0]["data"], dtype=np.float32).reshape(reply["outputs"][0]["shape"])
        want = ort.InferenceSession(str(bundle / "model.onnx"),
                                    providers=["CPUExecutionProvider"]).run(None, {"pixels": image})[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.mark.slow
def test_mlflow_models_serve_runs_the_published_runtime(temper, gated_digits, tmp_path, tracking_store):
    out = tmp_path / "out"
    assert temper("run", gated_digits, "--output", out).code == 0
    selected = json.loads((out / "report.json").read_text())["selected"]
    port = _free_port()
    venv_bin = str(Path(sys.executable).parent)
    env = {**os.environ, "MLFLOW_TRACKING_URI": tracking_store, "PATH": f"{venv_bin}:{os.environ['PATH']}"}
    server = subprocess.Popen([f"{venv_bin}/mlflow", "models", "serve", "-m", "models:/digits-cnn@candidate",
                               "--env-manager", "local", "-p", str(port), "--host", "127.0.0.1"],
                              env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert _wait_until_ok(port, "/ping", 120), "mlflow models serve never answered /ping"
        images = np.random.default_rng(2).random((3, 1, 8, 8), dtype=np.float32)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("POST", "/invocations", json.dumps({"inputs": {"pixels": images.tolist()}}),
                     {"Content-Type": "application/json"})
        response = conn.getresponse()
        assert response.status == 200
        got = np.asarray(json.loads(response.read())["predictions"]["logits"], dtype=np.float32)
        session = ort.InferenceSession(str(out / selected / "model.onnx"), providers=["CPUExecutionProvider"])
        np.testing.assert_allclose(got, session.run(None, {"pixels": images})[0], rtol=1e-5, atol=1e-5)
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.mark.slow
def test_the_backup_model_travels_with_the_published_bundle(temper, gated_digits, tmp_path, tracking_store):
    """A run whose selection has a peer that passed every gate on its engine publishes that peer in the bundle's
    backup/ (the model its output folder's burst fallback would use), checked against the manifest, and
    `temper serve models:/NAME@ALIAS --burst-fallback-ms` serves with it; a tampered backup is refused."""
    from temper.artifacts.formats.integrity import recorded, sha256_of
    from temper.pipeline.outputs import backup_of
    from tests.artifacts.servers import Client, _temper_serve

    # No speed gate: every candidate that keeps accuracy and fidelity passes, so the selection has peers.
    _by_size_without_a_speed_gate(gated_digits)
    out = tmp_path / "out"
    result = temper("run", gated_digits, "--output", out)
    assert result.code == 0, result.stderr
    name = backup_of(out)
    assert name is not None and name != json.loads((out / "report.json").read_text())["selected"]
    pulled = tmp_path / "pulled"
    assert temper("pull", "models:/digits-cnn@candidate", "--dest", pulled).code == 0
    assert json.loads((pulled / "runtime.json").read_text())["name"] == "digits-cnn"  # the bundle's, not backup/'s
    manifest = json.loads((out / "manifest.json").read_text())
    assert sha256_of(pulled / "backup" / "model.onnx") == recorded(manifest, name)["sha256"]
    assert json.loads((pulled / "backup" / "runtime.json").read_text())["max_batch_size"] == 16

    with _temper_serve("models:/digits-cnn@candidate", args=("--burst-fallback-ms", "50")) as (port, output):
        c = Client(port)
        image = np.zeros((1, 1, 8, 8), dtype=np.float32)
        status, _, body = c.infer({"inputs": [{"name": "pixels", "shape": [1, 1, 8, 8], "datatype": "FP32",
                                               "data": image.ravel().tolist()}]}, model="digits-cnn")
        c.close()
    assert status == 200 and json.loads(body)["parameters"]["temper_served_by"] == "primary", body
    assert "with the burst fallback to backup over 50 ms" in output["stdout"] + output["stderr"]

    with open(pulled / "backup" / "model.onnx", "ab") as f:  # changed after temper wrote it
        f.write(b"\0")
    served = temper("serve", pulled, "--burst-fallback-ms", "50", "--port", str(_free_port()))
    assert served.code == 2 and "backup/model.onnx" in served.stderr and "--burst-fallback-ms" in served.stderr, served

    # Exported from the run, the repository's version folder carries the same backup, checked the same way.
    assert temper("export-triton", out, "--dest", tmp_path / "repo").code == 0
    exported = tmp_path / "repo" / "digits-cnn" / "1" / "backup" / "model.onnx"
    assert sha256_of(exported) == recorded(manifest, name)["sha256"]
    with open(exported, "ab") as f:
        f.write(b"\0")
    served = temper("serve", tmp_path / "repo", "--burst-fallback-ms", "50", "--port", str(_free_port()))
    assert served.code == 2 and "1/backup/model.onnx" in served.stderr, served
