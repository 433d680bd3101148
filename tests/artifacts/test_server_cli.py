"""`temper serve` from the command line, in a new process: a bundle folder, a registered model, a
`temper run` output folder, and the one-line errors for what it cannot serve."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from temper.artifacts.core.host import profile
from temper.artifacts.formats import bundle
from tests.artifacts.servers import (
    MODEL,
    Client,
    _bundle,
    _expected,
    _free_port,
    _inputs,
    _json_request,
    _temper_serve,
    _tiny_model,
)
from tests.unit.reports import sample_report

# -- the CLI -------------------------------------------------------------------------------------


def _infer_checked(port: int, reference: ort.InferenceSession, model: str = MODEL) -> None:
    c = Client(port)
    inputs = _inputs(13)
    status, _, body = c.infer(_json_request(inputs), model=model)
    c.close()
    assert status == 200, body
    want = _expected(reference, inputs)["y"].ravel()
    np.testing.assert_allclose(json.loads(body)["outputs"][0]["data"], want, rtol=1e-6)


def _serve_and_infer(target: str, reference: ort.InferenceSession, env: dict | None = None) -> str:
    with _temper_serve(target, env) as (port, output):
        _infer_checked(port, reference)
    return output["stdout"]


def test_temper_serve_a_bundle_folder(tiny: Path, reference: ort.InferenceSession) -> None:
    stdout = _serve_and_infer(str(tiny), reference)
    assert "127.0.0.1" in stdout and f"/v2/models/{MODEL}" in stdout


@pytest.mark.slow
def test_temper_serve_a_registered_model(temper, tiny: Path, reference: ort.InferenceSession, tracking_store: str,
                                        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Also the unknown-alias error, in the same store: creating an MLflow sqlite store takes seconds."""
    import mlflow
    from mlflow.tracking._model_registry import utils as registry
    from mlflow.tracking._tracking_service import utils as tracking

    from temper.artifacts.registry.pyfunc import log_bundle

    # set_tracking_uri / set_registry_uri set globals (and MLFLOW_REGISTRY_URI) that would outlive this
    # test: later tests would register into this store
    monkeypatch.setattr(tracking, "_tracking_uri", tracking._tracking_uri)
    monkeypatch.setattr(registry, "_registry_uri", registry._registry_uri)
    monkeypatch.setenv("MLFLOW_REGISTRY_URI", tracking_store)
    client = mlflow.MlflowClient(tracking_store, tracking_store)
    mlflow.set_tracking_uri(tracking_store)
    mlflow.set_registry_uri(tracking_store)
    experiment = client.create_experiment("serve-test", artifact_location=(tmp_path / "artifacts").as_uri())
    with mlflow.start_run(experiment_id=experiment):
        info = log_bundle(tiny, name="model")
    mlflow.register_model(info.model_uri, MODEL)
    version = mlflow.register_model(info.model_uri, MODEL)  # version 2: the served version is the registry's
    assert str(version.version) == "2"
    client.set_registered_model_alias(MODEL, "champion", version.version)
    with _temper_serve(f"models:/{MODEL}@champion", {"MLFLOW_TRACKING_URI": tracking_store}) as (port, _):
        _infer_checked(port, reference)
        c = Client(port)
        try:
            status, _, body = c.call("GET", f"/v2/models/{MODEL}")
            assert status == 200 and json.loads(body)["versions"] == ["2"], body
            assert c.call("GET", f"/v2/models/{MODEL}/versions/2/ready")[0] == 200
            assert c.call("GET", f"/v2/models/{MODEL}/versions/1/ready")[0] == 404
        finally:
            c.close()
    result = temper("serve", f"models:/{MODEL}@no-such-alias")
    lines = result.stderr.strip().splitlines()
    assert (result.code == 2 and len(lines) == 1
            and lines[0].startswith(f"error: models:/{MODEL}@no-such-alias: MODEL: ")), result.stderr


def _run_output(folder: Path, tiny: Path, selected: str, publish: dict | None) -> Path:
    """An output folder as `temper run` writes it: baseline/ and int8/ models (other weights), the
    manifest with the resolved recipe, the report naming the selection."""
    records = []
    for name, seed in (("baseline", 0), ("int8", 5)):
        (folder / name).mkdir(parents=True)
        model = _tiny_model(folder / name / bundle.MODEL, seed)
        records.append({"id": f"{name}-id", "sha256": hashlib.sha256(model.read_bytes()).hexdigest(),
                        "bytes": model.stat().st_size})
    recipe = {"name": "tiny-recipe", "version": 1, **({"publish": publish} if publish else {})}
    manifest = {"recipe": {"name": "tiny-recipe", "file": "tiny.yaml", "resolved": recipe},
                "baseline": {"model": "baseline-id", "path": "baseline/model.onnx"},
                "candidates": {"int8": {"status": "ok", "model": "int8-id", "path": "int8/model.onnx", "error": None},
                               "fp16": {"status": "failed", "model": None, "path": None, "error": "broke"}},
                "models": records}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    report = {**sample_report(), "selected": selected, "selected_pair": selected,
              "host": profile().model_dump(mode="json")}
    (folder / "report.json").write_text(json.dumps(report))
    return folder


def test_temper_serve_a_run_output_folder_without_publishing(tiny: Path, tmp_path: Path) -> None:
    """OUTPUT serves its selection with the recipe's publish.serving options; OUTPUT/CANDIDATE that
    model, under the recipe's name when there is no publish section, with default options."""
    serving = {"max_batch_size": 4, "max_delay_ms": 1.0, "max_queue": 64, "timeout_s": 10.0, "pad": {}}
    output = _run_output(tmp_path / "out", tiny, "int8", {"mlflow": {"registered_model": MODEL}, "serving": serving})
    int8 = ort.InferenceSession(str(output / "int8" / bundle.MODEL), providers=["CPUExecutionProvider"])
    with _temper_serve(str(output)) as (port, _):
        _infer_checked(port, int8)
        c = Client(port)
        config = json.loads(c.call("GET", f"/v2/models/{MODEL}/config")[2])
        c.close()
    assert config["max_batch_size"] == 4 and config["dynamic_batching"]["max_queue_delay_microseconds"] == 1000

    baseline = ort.InferenceSession(str(output / "baseline" / bundle.MODEL), providers=["CPUExecutionProvider"])
    no_publish = _run_output(tmp_path / "plain", tiny, "int8", None)
    with _temper_serve(str(no_publish / "baseline")) as (port, output_text):
        _infer_checked(port, baseline, model="tiny-recipe")
        c = Client(port)
        config = json.loads(c.call("GET", "/v2/models/tiny-recipe/config")[2])
        c.close()
    assert config["max_batch_size"] == 16 and "/v2/models/tiny-recipe" in output_text["stdout"]


def test_temper_serve_a_run_output_folder_refuses_what_it_cannot_serve(temper, tiny: Path, tmp_path: Path) -> None:
    output = _run_output(tmp_path / "out", tiny, "int8", None)
    (output / "fp16").mkdir()  # a candidate that failed: no model
    for target, problem in ((output / "fp16", "cannot serve it from its run"),
                            (output / "nothing", "neither a serving bundle")):
        result = temper("serve", target)
        (line,) = result.stderr.strip().splitlines()
        assert result.code == 2 and problem in line and "serving" not in result.stdout, result.stderr
    (output / "report.json").unlink()  # not validated: a recipe without a validate section writes no report
    result = temper("serve", output)
    assert result.code == 2 and "names no selected model" in result.stderr


def _refused(*args: object) -> tuple[int, str]:
    """`temper ARGS` as a console-script process (exit code, stderr) when it refuses within a minute; a
    server that starts instead fails the test rather than blocking it."""
    try:
        done = subprocess.run([str(Path(sys.executable).parent / "temper"), *map(str, args), "--port", "0"],
                              capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"temper {args} served instead of refusing: {exc.stdout!r}") from None
    assert "serving" not in done.stdout, done.stdout
    return done.returncode, done.stderr


@pytest.mark.parametrize("selected", ["../outside", "ABSOLUTE"])
def test_serve_output_refuses_a_selection_that_is_not_one_of_its_candidates(tmp_path: Path, tiny: Path,
                                                                             selected: str) -> None:
    """report.json's `selected` names a candidate of the manifest, never a path to a model elsewhere."""
    output = _run_output(tmp_path / "out", tiny, "int8", None)
    (tmp_path / "outside").mkdir()
    _tiny_model(tmp_path / "outside" / bundle.MODEL, 9)  # a model a path could reach
    selected = str(tmp_path / "outside") if selected == "ABSOLUTE" else selected
    report = json.loads((output / "report.json").read_text())
    (output / "report.json").write_text(json.dumps({**report, "selected": selected}))
    code, stderr = _refused("serve", output)
    (line,) = stderr.strip().splitlines()
    assert code == 2 and line.startswith(f"error: {output}: MODEL: cannot serve it from its run: "), line
    assert f"{selected!r} is not the baseline nor a built candidate" in line and "int8" in line, line


def test_serve_output_candidate_dot_dot_is_not_the_folder_beside_the_output(tmp_path: Path, tiny: Path) -> None:
    """OUT/int8/../.. is the folder that holds OUT: not a model of the run, whatever model.onnx lies there."""
    output = _run_output(tmp_path / "out", tiny, "int8", None)
    _tiny_model(tmp_path / bundle.MODEL, 9)
    code, stderr = _refused("serve", f"{output}/int8/../..")
    (line,) = stderr.strip().splitlines()
    assert code == 2 and "neither a serving bundle folder" in line, line


@pytest.mark.parametrize("target", ["OUTPUT", "OUTPUT/int8"])
def test_serve_output_refuses_a_model_file_the_manifest_does_not_record(tmp_path: Path, tiny: Path,
                                                                        target: str) -> None:
    output = _run_output(tmp_path / "out", tiny, "int8", None)
    shutil.copy2(output / "baseline" / bundle.MODEL, output / "int8" / bundle.MODEL)  # same size, other weights
    code, stderr = _refused("serve", output if target == "OUTPUT" else output / "int8")
    (line,) = stderr.strip().splitlines()
    assert code == 2 and line.startswith(f"error: {output}/int8/model.onnx: is not the int8 model manifest.json "
                                         "records"), line
    assert "rebuild the folder with `temper run`" in line, line


def test_temper_serve_on_a_busy_port_says_so_in_one_line(temper, tiny: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = temper("serve", tiny, "--port", port)
    (line,) = result.stderr.strip().splitlines()
    assert result.code == 3 and "serving" not in result.stdout, result
    assert line.startswith(f"error: --port: cannot listen on 127.0.0.1:{port}") and "in use" in line, line


def test_temper_serve_rejects_what_is_not_a_bundle(temper, tmp_path: Path) -> None:
    result = temper("serve", tmp_path / "nothing-here")
    assert result.code == 2
    assert "error:" in result.stderr and "nothing-here" in result.stderr and "models:/" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("name", ["team/digits", "..", "a\tb"])
def test_a_model_name_no_route_can_reach_is_refused_at_start(temper, tmp_path: Path, name: str) -> None:
    """On main, a name with '/' served: ready, while every /v2/models/... route answered 404."""
    folder = _bundle(tmp_path / "bundle", _tiny_model(tmp_path / "tiny.onnx"), name)
    result = temper("serve", folder, "--port", _free_port())
    (line,) = result.stderr.strip().splitlines()
    assert result.code == 2 and "serving" not in result.stdout, result
    assert line.startswith(f"error: {folder / 'runtime.json'}: name: the model name {name!r}"), line
    assert "/v2/models/NAME/" in line


def test_a_model_name_with_spaces_and_dots_is_served(tmp_path: Path) -> None:
    """What routes is not refused: a name clients percent-encode, with dots inside."""
    reference = ort.InferenceSession(_tiny_model(tmp_path / "tiny.onnx"))
    folder = _bundle(tmp_path / "bundle", tmp_path / "tiny.onnx", "digits v1.2")
    with _temper_serve(str(folder)) as (port, _):
        _infer_checked(port, reference, model="digits%20v1.2")


def test_a_host_that_is_not_an_address_is_a_bad_flag(temper, tiny: Path) -> None:
    """Exit 2 naming --host (was exit 3 blaming --port, as if the host were at fault)."""
    result = temper("serve", tiny, "--host", "no-such-host.invalid")
    (line,) = result.stderr.strip().splitlines()
    assert result.code == 2 and "serving" not in result.stdout, result
    assert "--host: 'no-such-host.invalid' is not an address to listen on" in line, line


@pytest.mark.parametrize("instances", [[], ["--instances", "0"]], ids=["default-instances", "in-process"])
def test_serving_an_openvino_pick_without_openvino_says_to_install_it(tmp_path: Path, instances: list[str]) -> None:
    """An environment that lacks a package is exit 3 with the install line; it was exit 2 and "pull it again",
    as if the bundle were broken (#36.17). OpenVINO is hidden by a package of its name that cannot be imported,
    in this process and any worker it starts."""
    from tests.pipeline.test_cli_contract import one_line
    from tests.pipeline.test_cli_contract import temper as console

    model = _tiny_model(tmp_path / "tiny.onnx")
    folder = bundle.write(tmp_path / "bundle", model, bundle.config_for(model, MODEL, engine="openvino"))
    hidden = tmp_path / "no-openvino" / "openvino"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text("raise ImportError(\"No module named 'openvino'\")\n")
    path = os.pathsep.join([str(hidden.parent), *filter(None, [os.environ.get("PYTHONPATH")])])
    result = console("serve", folder, "--port", "0", *instances, PYTHONPATH=path)
    assert result.returncode == 3, result.stderr
    line = one_line(result)
    assert "pip install 'temper-ml[openvino]'" in line and "pull it again" not in line, line
    assert "serving" not in result.stdout
