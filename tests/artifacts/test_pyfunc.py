"""The runtime as an MLflow pyfunc model: logged and registered into a real sqlite store, then
loaded by a fresh process that has only the model's own code."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import mlflow
import numpy as np
import onnx
import onnxruntime as ort
import pandas as pd
import pytest
from onnx import TensorProto, helper, numpy_helper

from artifacts.bundle import config_for, write
from artifacts.pyfunc import as_inputs, log_bundle
from tests.conftest import REPO

WEIGHTS = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)

LOAD_AND_PREDICT = """
import sys, mlflow, numpy as np, pandas as pd
model = mlflow.pyfunc.load_model("models:/tiny/1")
import artifacts.pyfunc
print(artifacts.pyfunc.__file__)
inputs = dict(np.load(sys.argv[1]))
np.save(sys.argv[2], model.predict(inputs)["y"])
frame = pd.DataFrame({name: list(value.tolist()) for name, value in inputs.items()})
np.save(sys.argv[3], model.predict(frame)["y"])
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
    inputs = {name: rng.standard_normal((10, 4)).astype(np.float32) for name in ("a", "b")}  # 10 rows > max_batch_size 4
    np.savez(tmp_path / "inputs.npz", **inputs)
    result = subprocess.run(
        [sys.executable, "-c", LOAD_AND_PREDICT, *(str(tmp_path / f) for f in ("inputs.npz", "dict.npy", "frame.npy"))],
        env={**os.environ, "MLFLOW_TRACKING_URI": uri}, cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False,
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
    assert as_inputs({"a": [[1, 2, 3, 4]], "b": np.zeros((1, 4))}, config)["b"].dtype == np.float64  # arrays keep theirs
    with pytest.raises(ValueError, match="has 2 inputs"):
        as_inputs(np.zeros((1, 4), np.float32), config)
