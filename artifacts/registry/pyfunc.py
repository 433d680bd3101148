"""The serving runtime as an MLflow pyfunc model, loadable without temper installed.

log_bundle ships this package as the model's code (`temper/artifacts/`, under temper's own
name, so a serving application's own `artifacts` module is untouched) and the bundle folder as
its one artifact, so `mlflow.pyfunc.load_model("models:/<name>/<version>")` needs only the
pinned pip requirements. predict always returns dict[str, np.ndarray] keyed by output name,
one-output models included, matching the named-tensor signature.

The signature names each input with its dtype and shape, and MLflow checks what predict and
`mlflow models serve` receive against it before this code runs (docs/serving.md
lists the forms that pass): a dict of arrays of exactly those dtypes, one array for a
one-input model, a DataFrame with one column per input whose cells are rows (flat lists, or
arrays) when every dim but the batch is fixed; served, also `inputs` and `instances` JSON of
nested lists, which MLflow casts to the signature's dtypes.
"""

from __future__ import annotations

import shutil
import tempfile
import warnings
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
from mlflow.models import ModelSignature
from mlflow.models.model import ModelInfo
from mlflow.pyfunc.model import PythonModel, PythonModelContext
from mlflow.types import Schema, TensorSpec

from temper.artifacts import engines
from temper.artifacts.core import distributions
from temper.artifacts.core.layout import to_axis
from temper.artifacts.formats.bundle import ServingConfig, example_inputs, read
from temper.artifacts.formats.integrity import Mismatch, check_bundle
from temper.artifacts.serving.runtime import RequestError, Runtime

REQUIREMENTS = distributions.of_role("served")  # core/distributions.py: onnxruntime, numpy, pandas, mlflow, ...
EXAMPLE_DYNAMIC_DIM = 8


class TemperModel(PythonModel):
    """Offline predict through Runtime.run_batch: any number of rows, chunked to max_batch_size."""

    def load_context(self, context: PythonModelContext) -> None:
        # Warm up but start no batching thread: predict bypasses the queue, and a thread
        # would keep the session alive for the life of the process after every load
        # (log_model itself loads the model once to validate the input example).
        folder = Path(context.artifacts["bundle"])
        try:  # the model file is the one the manifest it ships records, before anything runs it
            unchecked = check_bundle(folder, "download the model again, or publish it again with `temper run`")
        except Mismatch as exc:
            raise Mismatch(exc.file, f"{exc.file}: {exc}") from None
        if unchecked:
            warnings.warn(unchecked, RuntimeWarning, stacklevel=2)
        self.runtime = Runtime(folder)
        for warning in (self.runtime.host_warning, self.runtime.drift_warning):
            if warning:  # reaches pyfunc users whatever their logging setup; filterable
                warnings.warn(warning, RuntimeWarning, stacklevel=2)
        self.runtime.warm_up()

    # model_input is deliberately unannotated: MLflow derives a schema from that type hint
    # and would replace the ServingConfig signature with it.
    def predict(self, context: PythonModelContext, model_input,
                params: dict | None = None) -> dict[str, np.ndarray]:
        """Accepts a dict of arrays, one array (single-input models) or a DataFrame whose
        columns are input names and whose cells are rows (lists or arrays); arrays of another
        numeric dtype are cast when their values fit (see conform)."""
        config = self.runtime.config
        return self.runtime.run_batch(conform(as_inputs(model_input, config), config))


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
        axes = config.layout().inputs  # a cell is one row: rows go to each input's batch axis
        return {name: _column(model_input[name], dtypes[name], axes.get(name, 0)) for name in model_input.columns}
    if isinstance(model_input, np.ndarray):
        if len(config.inputs) != 1:
            raise RequestError(f"this model has {len(config.inputs)} inputs; "
                               f"pass a dict or DataFrame keyed by {[s.name for s in config.inputs]}")
        return {config.inputs[0].name: model_input}
    raise RequestError(f"unsupported input type {type(model_input).__name__}: "
                       "pass a dict of arrays, an array or a DataFrame")


def _column(cells: pd.Series, dtype: str, axis: int | None) -> np.ndarray:
    """A DataFrame column as one input: its rows on the batch axis, or for an unbatched input (a constant)
    the one value every row holds."""
    stacked = np.stack([np.asarray(cell) for cell in cells]).astype(dtype)
    if axis is None:
        if len(stacked) and not (stacked == stacked[:1]).all():
            raise RequestError(f"input {cells.name!r} is not batched: every row must hold the same value")
        return stacked[0]
    return to_axis(stacked, axis)


def conform(inputs: dict[str, np.ndarray], config: ServingConfig) -> dict[str, np.ndarray]:
    """Arrays of another numeric dtype cast to the config's when every value fits: float64 to
    float32 within float32's range, int32 to int64, int64 to int32 or uint8 within theirs.

    Through MLflow only one case gets here with another dtype: a DataFrame whose cells are arrays,
    which MLflow stacks without casting (it checks a dict's arrays against the signature, and casts
    list cells), although its docs say a DataFrame's columns are cast to the signature's type. What
    does not fit (1e300 for float32, a float for an int input) is left for the runtime to refuse."""
    dtypes = {spec.name: np.dtype(spec.dtype) for spec in config.inputs}
    return {
        name: array.astype(dtypes[name]) if name in dtypes and _fits(array, dtypes[name]) else array
        for name, array in inputs.items()
    }


def _fits(array: object, dtype: np.dtype) -> bool:
    if not isinstance(array, np.ndarray) or array.dtype == dtype or array.size == 0:
        return False
    if dtype.kind == "f" and array.dtype.kind in "iuf":
        finite = array[np.isfinite(array)] if array.dtype.kind == "f" else array
        return finite.size == 0 or float(np.abs(finite).max()) <= float(np.finfo(dtype).max)
    if dtype.kind in "iu" and array.dtype.kind in "iu":
        limits = np.iinfo(dtype)
        return int(array.min()) >= limits.min and int(array.max()) <= limits.max
    return False


def signature(config: ServingConfig) -> ModelSignature:
    """Named tensor specs straight from the config (-1 = dynamic), not inferred from an example."""

    def schema(specs: list) -> Schema:
        return Schema([TensorSpec(np.dtype(s.dtype), tuple(s.shape), s.name) for s in specs])

    return ModelSignature(inputs=schema(config.inputs), outputs=schema(config.outputs))


def input_example(config: ServingConfig) -> dict[str, np.ndarray]:
    """One row of zeros, dynamic dims set to 8: small, valid and cheap to validate at log time."""
    return example_inputs(config, 1, EXAMPLE_DYNAMIC_DIM)


def pinned_requirements(row: str = "cpu") -> list[str]:
    """The installed versions the model was verified with, with the packages the runtime of its row needs
    (a model selected on OpenVINO requires the openvino the gates ran it on, and only that model does);
    onnxruntime-gpu stands in for onnxruntime on hosts that have it instead, with its CUDA and cuDNN wheels
    (its `cuda,cudnn` extras), which a GPU serving host needs as much as the runtime."""
    return [distributions.pin(package) for package in (*REQUIREMENTS, *engines.of(row).packages)]


def log_bundle(bundle: Path, name: str = "model") -> ModelInfo:
    """Log the bundle as a pyfunc model in the active MLflow run."""
    config = read(bundle)
    with tempfile.TemporaryDirectory() as staging:
        code = _stage_code(Path(staging))
        return mlflow.pyfunc.log_model(
            name=name,
            python_model=TemperModel(),
            artifacts={"bundle": str(bundle)},
            code_paths=[str(code)],
            signature=signature(config),
            input_example=input_example(config),
            pip_requirements=pinned_requirements(config.engine or "cpu"),
        )


def _stage_code(staging: Path) -> Path:
    """staging/temper/artifacts/: MLflow copies a code path folder under its own name and puts the
    folder above it on sys.path, so shipping `temper/` makes `temper.artifacts` importable there."""
    package = Path(__file__).resolve().parents[1]  # artifacts/, above registry/
    shutil.copytree(package, staging / "temper" / "artifacts", ignore=shutil.ignore_patterns("__pycache__"))
    return staging / "temper"
