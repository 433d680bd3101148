"""The serving runtime as an MLflow pyfunc model, loadable without temper installed.

log_bundle ships this package (artifacts/) as the model's code_paths and the bundle folder as
its one artifact, so `mlflow.pyfunc.load_model("models:/<name>/<version>")` needs only the
pinned pip requirements. predict always returns dict[str, np.ndarray] keyed by output name,
one-output models included, matching the named-tensor signature.
"""

from __future__ import annotations

import warnings
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
from mlflow.models import ModelSignature
from mlflow.models.model import ModelInfo
from mlflow.types import Schema, TensorSpec

from artifacts.bundle import ServingConfig, read
from artifacts.runtime import RequestError, Runtime

REQUIREMENTS = ("onnxruntime", "numpy", "pandas", "mlflow", "onnx", "pydantic", "psutil")
EXAMPLE_DYNAMIC_DIM = 8


class TemperModel(mlflow.pyfunc.PythonModel):
    """Offline predict through Runtime.run_batch: any number of rows, chunked to max_batch_size."""

    def load_context(self, context: mlflow.pyfunc.PythonModelContext) -> None:
        # Warm up but start no batching thread: predict bypasses the queue, and a thread
        # would keep the session alive for the life of the process after every load
        # (log_model itself loads the model once to validate the input example).
        self.runtime = Runtime(Path(context.artifacts["bundle"]))
        if self.runtime.host_warning:  # reaches pyfunc users whatever their logging setup; filterable
            warnings.warn(self.runtime.host_warning, RuntimeWarning, stacklevel=2)
        self.runtime.warm_up()

    # model_input is deliberately unannotated: MLflow derives a schema from that type hint
    # and would replace the ServingConfig signature with it.
    def predict(self, context: mlflow.pyfunc.PythonModelContext, model_input, params: dict | None = None) -> dict[str, np.ndarray]:
        """Accepts a dict of arrays, one array (single-input models) or a DataFrame whose
        columns are input names and whose cells are rows (lists or arrays)."""
        return self.runtime.run_batch(as_inputs(model_input, self.runtime.config))


def as_inputs(model_input: object, config: ServingConfig) -> dict[str, np.ndarray]:
    """Named arrays from any accepted predict input. Lists and DataFrame cells are cast to the
    config dtype because they carry none; arrays keep theirs, so a wrong dtype is an error."""
    dtypes = {spec.name: spec.dtype for spec in config.inputs}
    if isinstance(model_input, dict):
        return {
            name: value if isinstance(value, np.ndarray) else np.asarray(value, dtype=dtypes.get(name))
            for name, value in model_input.items()
        }
    if isinstance(model_input, pd.DataFrame):
        unknown = sorted(set(model_input.columns) - set(dtypes))
        if unknown:
            raise RequestError(f"unknown input column(s) {unknown}; expected {sorted(dtypes)}")
        return {name: np.stack([np.asarray(cell) for cell in model_input[name]]).astype(dtypes[name]) for name in model_input.columns}
    if isinstance(model_input, np.ndarray):
        if len(config.inputs) != 1:
            raise RequestError(f"this model has {len(config.inputs)} inputs; pass a dict or DataFrame keyed by {[s.name for s in config.inputs]}")
        return {config.inputs[0].name: model_input}
    raise RequestError(f"unsupported input type {type(model_input).__name__}: pass a dict of arrays, an array or a DataFrame")


def signature(config: ServingConfig) -> ModelSignature:
    """Named tensor specs straight from the config (-1 = dynamic), not inferred from an example."""

    def schema(specs: list) -> Schema:
        return Schema([TensorSpec(np.dtype(s.dtype), tuple(s.shape), s.name) for s in specs])

    return ModelSignature(inputs=schema(config.inputs), outputs=schema(config.outputs))


def input_example(config: ServingConfig) -> dict[str, np.ndarray]:
    """One row of zeros, dynamic dims set to 8: small, valid and cheap to validate at log time."""
    return {
        s.name: np.zeros([1] + [d if d > 0 else EXAMPLE_DYNAMIC_DIM for d in s.shape[1:]], dtype=s.dtype)
        for s in config.inputs
    }


def pinned_requirements() -> list[str]:
    """The installed versions the model was verified with; onnxruntime-gpu stands in for
    onnxruntime on hosts that have it instead."""
    pins = []
    for package in REQUIREMENTS:
        candidates = ("onnxruntime-gpu", package) if package == "onnxruntime" else (package,)
        for candidate in candidates:
            try:
                pins.append(f"{candidate}=={version(candidate)}")
                break
            except PackageNotFoundError:
                continue
        else:
            raise PackageNotFoundError(package)
    return pins


def log_bundle(bundle: Path, name: str = "model") -> ModelInfo:
    """Log the bundle as a pyfunc model in the active MLflow run."""
    config = read(bundle)
    return mlflow.pyfunc.log_model(
        name=name,
        python_model=TemperModel(),
        artifacts={"bundle": str(bundle)},
        code_paths=[str(Path(__file__).resolve().parent)],
        signature=signature(config),
        input_example=input_example(config),
        pip_requirements=pinned_requirements(),
    )
