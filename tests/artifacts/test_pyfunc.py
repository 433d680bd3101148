"""The runtime as an MLflow pyfunc model: logged and registered into a real sqlite store, then
loaded by a fresh process that has only the model's own code."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import mlflow
import numpy as np
import onnx
import onnxruntime as ort
import pandas as pd
import pytest
from mlflow.exceptions import MlflowException
from onnx import TensorProto, helper, numpy_helper

from temper.artifacts.formats.bundle import config_for, write
from temper.artifacts.registry.pyfunc import as_inputs, conform, log_bundle
from temper.artifacts.serving.runtime import RequestError, Runtime
from tests.helpers import REPO

WEIGHTS = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)

LOAD_AND_PREDICT = """
import sys, mlflow, numpy as np, pandas as pd
import artifacts  # the serving application's own module of that name, loaded first
model = mlflow.pyfunc.load_model("models:/tiny/1")
import temper.artifacts.registry.pyfunc
print(temper.artifacts.registry.pyfunc.__file__)
inputs = dict(np.load(sys.argv[1]))
np.save(sys.argv[2], model.predict(inputs)["y"])
frame = pd.DataFrame({name: list(value.tolist()) for name, value in inputs.items()})
np.save(sys.argv[3], model.predict(frame)["y"])
import artifacts
assert artifacts.OWNER == "the serving application", artifacts.__file__
"""


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    """A two-input model, y = (a + b) @ W, as a serving bundle."""
    nodes = [helper.make_node("Add", ["a", "b"], ["s"]), helper.make_node("MatMul", ["s", "W"], ["y"])]
    graph = helper.make_graph(
        nodes, "tiny",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", 4]) for n in ("a", "b")],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
        [numpy_helper.from_array(WEIGHTS, "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    path = tmp_path / "export" / "tiny.onnx"
    path.parent.mkdir()
    onnx.save(model, path)
    return write(tmp_path / "bundle", path, config_for(path, "tiny", max_batch_size=4))


@pytest.fixture
def tracking(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A private sqlite store and artifact folder; the previous tracking URI is restored after."""
    previous = mlflow.get_tracking_uri()
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    mlflow.set_tracking_uri(uri)
    experiment = mlflow.create_experiment("temper-pyfunc", artifact_location=str(tmp_path / "mlartifacts"))
    yield uri, experiment
    mlflow.set_tracking_uri(previous)


@pytest.mark.slow
def test_logged_model_loads_in_a_fresh_process_and_predicts_like_onnx(bundle: Path, tracking, tmp_path: Path) -> None:
    uri, experiment = tracking
    with mlflow.start_run(experiment_id=experiment):
        info = log_bundle(bundle, name="model")
    mlflow.register_model(info.model_uri, "tiny")

    config = config_for(bundle / "model.onnx", "tiny")
    logged = [(s.name, s.type, s.shape) for s in info.signature.inputs.inputs]
    assert logged == [(s.name, np.dtype(s.dtype), tuple(s.shape)) for s in config.inputs]
    assert [s.name for s in info.signature.outputs.inputs] == ["y"]

    rng = np.random.default_rng(1)
    inputs = {name: rng.standard_normal((10, 4)).astype(np.float32)
              for name in ("a", "b")}  # 10 rows > max_batch_size 4
    np.savez(tmp_path / "inputs.npz", **inputs)
    application = tmp_path / "application"
    application.mkdir()
    (application / "artifacts.py").write_text('OWNER = "the serving application"\n')
    result = subprocess.run(
        [sys.executable, "-c", LOAD_AND_PREDICT, *(str(tmp_path / f) for f in ("inputs.npz", "dict.npy", "frame.npy"))],
        env={**os.environ, "MLFLOW_TRACKING_URI": uri, "PYTHONPATH": str(application)}, cwd=tmp_path,
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert result.returncode == 0, result.stderr
    assert REPO not in Path(result.stdout.strip().splitlines()[-1]).parents  # imported from the model's code_paths

    session = ort.InferenceSession(str(bundle / "model.onnx"), providers=["CPUExecutionProvider"])
    expected = session.run(None, inputs)[0]
    np.testing.assert_allclose(np.load(tmp_path / "dict.npy"), expected, rtol=1e-6)
    np.testing.assert_allclose(np.load(tmp_path / "frame.npy"), expected, rtol=1e-6)


def test_predict_inputs_from_dataframes_and_arrays(bundle: Path) -> None:
    config = config_for(bundle / "model.onnx", "tiny")
    frame = pd.DataFrame({"a": [[1, 2, 3, 4]], "b": [np.zeros(4)]})
    converted = as_inputs(frame, config)
    assert converted["a"].dtype == np.float32 and converted["a"].shape == (1, 4)
    assert as_inputs({"a": [[1, 2, 3, 4]], "b": np.zeros((1, 4))}, config)["a"].dtype == np.float32
    assert as_inputs({"a": [[1, 2, 3, 4]], "b": np.zeros((1, 4))},
                     config)["b"].dtype == np.float64  # arrays keep theirs
    with pytest.raises(ValueError, match="has 2 inputs"):
        as_inputs(np.zeros((1, 4), np.float32), config)


# The input forms docs/serving.md lists, on real logged models: an image-like
# model (every dim but the batch fixed) and a token-like one (a dynamic sequence dim).

PIXELS = np.random.default_rng(2).standard_normal((3, 1, 8, 8))  # float64, as numpy makes it
IMAGE_WEIGHTS = np.random.default_rng(3).standard_normal((64, 3)).astype(np.float32)


def _logged(folder: Path, graph: onnx.GraphProto) -> Path:
    """The graph as a serving bundle, logged with log_bundle into a private store; the local model folder."""
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    path = folder / "export" / f"{graph.name}.onnx"
    path.parent.mkdir(parents=True)
    onnx.save(model, path)
    packed = write(folder / "bundle", path, config_for(path, graph.name, max_batch_size=2))
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(f"sqlite:///{folder / 'mlflow.db'}")
    try:
        experiment = mlflow.create_experiment("forms", artifact_location=str(folder / "mlartifacts"))
        with mlflow.start_run(experiment_id=experiment):
            info = log_bundle(packed)
        return Path(mlflow.artifacts.download_artifacts(info.model_uri, dst_path=str(folder / "model")))
    finally:
        mlflow.set_tracking_uri(previous)


@pytest.fixture(scope="module")
def image_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """pixels [batch, 1, 8, 8] float32 -> y = flatten(pixels) @ W [batch, 3], logged once for the module."""
    nodes = [helper.make_node("Flatten", ["pixels"], ["f"], axis=1), helper.make_node("MatMul", ["f", "W"], ["y"])]
    graph = helper.make_graph(
        nodes, "image",
        [helper.make_tensor_value_info("pixels", TensorProto.FLOAT, ["batch", 1, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
        [numpy_helper.from_array(IMAGE_WEIGHTS, "W")],
    )
    return _logged(tmp_path_factory.mktemp("image"), graph)


def _image_y(pixels: np.ndarray) -> np.ndarray:
    return pixels.reshape(len(pixels), -1).astype(np.float32) @ IMAGE_WEIGHTS


def test_pyfunc_predict_takes_arrays_and_dataframes_of_rows(image_model: Path) -> None:
    model = mlflow.pyfunc.load_model(str(image_model))
    expected = _image_y(PIXELS)
    x = PIXELS.astype(np.float32)
    accepted = {
        "dict of float32 arrays": {"pixels": x},
        "one float32 array": x,
        "DataFrame, float32 array cells": pd.DataFrame({"pixels": list(x)}),
        "DataFrame, float64 array cells (cast)": pd.DataFrame({"pixels": list(PIXELS)}),
        "DataFrame, flat list cells": pd.DataFrame({"pixels": [row.ravel().tolist() for row in PIXELS]}),
    }
    for form, model_input in accepted.items():
        y = model.predict(model_input)["y"]
        assert y.dtype == np.float32, form
        np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5, err_msg=form)


def test_pyfunc_predict_refuses_what_the_signature_does_not_describe_in_mlflow_words(image_model: Path) -> None:
    """MLflow checks the named-tensor signature before the model runs; these are its messages."""
    model = mlflow.pyfunc.load_model(str(image_model))
    refused = {
        "dtype of input float64 does not match expected dtype float32": {"pixels": PIXELS},
        "dict with value type <class 'list'>": {"pixels": PIXELS.tolist()},
        "python list containing scalar values": pd.DataFrame({"pixels": list(PIXELS.tolist())}),
    }
    for message, model_input in refused.items():
        with pytest.raises(MlflowException, match=message):
            model.predict(model_input)


def test_pyfunc_dynamic_dims_take_dicts_not_dataframes(tmp_path: Path) -> None:
    """input_ids / attention_mask [batch, seq] int64 -> y = sum(ids * mask) per row, like a token model."""
    nodes = [
        helper.make_node("Mul", ["input_ids", "attention_mask"], ["m"]),
        helper.make_node("Cast", ["m"], ["c"], to=TensorProto.FLOAT),
        helper.make_node("ReduceSum", ["c", "axes"], ["y"], keepdims=1),
    ]
    graph = helper.make_graph(
        nodes, "tokens",
        [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "seq"])
         for n in ("input_ids", "attention_mask")],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 1])],
        [numpy_helper.from_array(np.array([1], np.int64), "axes")],
    )
    model = mlflow.pyfunc.load_model(str(_logged(tmp_path, graph)))
    ids = np.arange(15).reshape(3, 5)  # int64
    mask = np.array([[1, 1, 1, 0, 0]] * 3)
    y = model.predict({"input_ids": ids, "attention_mask": mask})["y"]
    np.testing.assert_array_equal(y, (ids * mask).sum(axis=1, keepdims=True).astype(np.float32))
    with pytest.raises(MlflowException, match="other dimensions must be fixed"):
        model.predict(pd.DataFrame({"input_ids": list(ids), "attention_mask": list(mask)}))


def test_conform_casts_only_what_fits(bundle: Path) -> None:
    config = config_for(bundle / "model.onnx", "tiny")
    cast = conform({"a": np.ones((1, 4)), "b": np.full((1, 4), np.nan)}, config)
    assert cast["a"].dtype == np.float32 and cast["b"].dtype == np.float32  # NaN fits; the runtime refuses it
    assert conform({"a": np.full((1, 4), 1e300)}, config)["a"].dtype == np.float64  # would be inf
    assert conform({"a": np.ones((1, 4), np.int32)}, config)["a"].dtype == np.float32
    assert conform({"a": np.ones((1, 4), bool), "c": np.ones(2)},
                   config)["a"].dtype == bool  # not numeric; unknown names kept
    with pytest.raises(RequestError, match="has dtype float64"):
        Runtime(bundle).run_batch(conform({"a": np.full((1, 4), 1e300), "b": np.zeros((1, 4), np.float32)}, config))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _post(port: int, body: object) -> tuple[int, dict]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/invocations", data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@pytest.fixture
def served(image_model: Path, tmp_path: Path) -> Iterator[int]:
    """`mlflow models serve --env-manager local` on 127.0.0.1, one worker; stopped by its process group."""
    port = _free_port()
    bin_dir = Path(sys.executable).parent
    log = tmp_path / "serve.log"
    with log.open("w") as out:
        server = subprocess.Popen(
            [str(bin_dir / "mlflow"), "models", "serve", "-m", str(image_model), "--env-manager", "local",
             "-h", "127.0.0.1", "-p", str(port), "-w", "1"],
            env={**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"},
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, f"mlflow models serve exited {server.returncode}: {log.read_text()[-2000:]}"
            assert time.monotonic() < deadline, f"not ready in 120 s: {log.read_text()[-2000:]}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2):
                    break
            except OSError:
                time.sleep(0.5)
        yield port
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # its own session: the group is the server and its workers
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=30)


def test_mlflow_models_serve_takes_split_inputs_and_instances(served: int) -> None:
    expected = _image_y(PIXELS)
    rows = PIXELS.tolist()
    accepted = {
        "dataframe_split, flat rows": {"dataframe_split": {"columns": ["pixels"],
                                                           "data": [[np.ravel(r).tolist()] for r in rows]}},
        "inputs, named": {"inputs": {"pixels": rows}},
        "inputs, one tensor": {"inputs": rows},
        "instances": {"instances": [{"pixels": r} for r in rows]},
    }
    for form, body in accepted.items():
        status, answer = _post(served, body)
        assert status == 200, (form, answer)
        np.testing.assert_allclose(np.array(answer["predictions"]["y"]), expected, rtol=1e-5, atol=1e-5, err_msg=form)

    status, answer = _post(served, {"dataframe_split": {"columns": ["pixels"], "data": [[r] for r in rows]}})
    assert status == 400 and "python list containing scalar values" in answer["message"]  # nested rows: flatten them
