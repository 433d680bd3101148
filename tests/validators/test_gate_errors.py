"""Bad `validate` sections: one line naming the recipe file and the key path, exit 2 (3 for a missing
provider), and no output folder left behind, whether the schema or the run finds the problem."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper

ROWS = 32


def _tiny_onnx(path: Path, width: int) -> None:
    """x [batch, 4] -> y [batch, width]: class scores when width = the label count, an 'embedding' otherwise."""
    weight = numpy_helper.from_array(np.random.default_rng(0).random((4, width), dtype=np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="matmul_0")], "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", width])], [weight],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def _data(path: Path, classes: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    np.savez(path, x=rng.random((ROWS, 4), dtype=np.float32), label=rng.integers(0, classes, ROWS).astype(np.int64))


def _recipe(folder: Path, validate: dict, *, width: int = 3, classes: int = 3, label: bool = True,
            calibration: bool = False, candidates: dict | None = None) -> dict:
    """A tiny ONNX recipe with an evaluation set (labels in column `label`) and the given validate section."""
    _tiny_onnx(folder / "tiny.onnx", width)
    _data(folder / "eval.npz", classes, 1)
    _data(folder / "calib.npz", classes, 2)
    data: dict = {"evaluation": {"path": "eval.npz", "batch_size": 8}}
    if label:
        data["evaluation"]["label"] = "label"
    if calibration:
        data["calibration"] = {"path": "calib.npz", "batch_size": 8}  # no label column named
    return {
        "version": 1, "name": "tiny",
        "model": {"onnx": "tiny.onnx", "inputs": [{"name": "x", "shape": ["batch", 4]}], "outputs": ["y"]},
        "data": data,
        # fp16 needs no calibration data (quantize mode: dynamic should not either, but the runner asks for it)
        "candidates": candidates or {"fp16": {"steps": ["fp16"]}},
        "validate": validate,
    }


def _fast(**throughput) -> dict:
    return {"batch_sizes": [1, 8], "duration_s": 0.2, "warmup_s": 0, **throughput}


def _write(folder: Path, data: dict) -> Path:
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _one_line(result) -> str:
    """The one error line. Problems found after the build may follow the progress log of the steps that
    finished (`  ✓ chain › step  0.0s`); anything else on stderr (a traceback, a second error) fails."""
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line.strip() for line in result.stderr.splitlines() if line.strip()]
    assert lines, "nothing on stderr"
    *before, line = lines
    assert all(b.startswith("✓ ") for b in before), result.stderr
    assert line.startswith("error: "), result.stderr
    return line


def _no_output(out: Path) -> None:
    assert not out.exists(), "a failed run must not leave an output folder"
    assert not list(out.parent.glob(f".{out.name}.partial-*")), "staging folder left behind"


def _run_is_bad_input(temper, tmp_path: Path, data: dict, key: str, *fragments: str) -> str:
    """`temper run` on `data`: exit 2, one line `error: <file>: <key>: ...` holding every fragment, no output."""
    recipe = _write(tmp_path, data)
    out = tmp_path / "out"
    result = temper("run", recipe, "--output", out)
    assert result.code == 2, (result.code, result.stderr)
    line = _one_line(result)
    assert line.startswith(f"error: {recipe}: {key}: "), line
    for fragment in fragments:
        assert fragment in line, line
    _no_output(out)
    return line


def test_the_tiny_recipe_validates(temper, tmp_path):
    """The base the error cases edit is sound: it runs, gates and writes its folder."""
    data = _recipe(tmp_path, {"accuracy": {"metric": "top1", "max_drop": 0.5}, "throughput": _fast()})
    out = tmp_path / "out"
    result = temper("run", _write(tmp_path, data), "--output", out)
    assert result.code in (0, 1), result.stderr
    assert (out / "report.json").is_file() and (out / "manifest.json").is_file()


def test_unknown_metric_lists_the_valid_ones(temper, tmp_path):
    data = _recipe(tmp_path, {"accuracy": {"metric": "top-1", "max_drop": 0.01}, "throughput": _fast()})
    _run_is_bad_input(temper, tmp_path, data, "validate.accuracy.metric", "'top-1' is not a metric",
                      "top1, topk, f1, cosine, mse, probe", "file.py:function")


def test_top1_on_an_embedding_output_suggests_cosine_or_probe(temper, tmp_path):
    data = _recipe(tmp_path, {"accuracy": {"metric": "top1", "max_drop": 0.01}, "throughput": _fast()},
                   width=16, classes=2)
    _run_is_bad_input(temper, tmp_path, data, "validate.accuracy.metric",
                      "16 columns", "2 classes", "cosine or probe")


@pytest.mark.parametrize("budget, fragments", [
    (-0.01, ("-0.01 is negative", ">= 0")),
    ([1], ("[1] is not a budget", "0.01", "'1%'")),
    ("abc", ("'abc' is not a budget", "'1%'")),
    (float("nan"), ("nan is not a budget", "finite")),  # NaN would fail every candidate's accuracy gate
], ids=["negative", "list", "text", "nan"])
def test_budget_of_the_wrong_sign_or_type(temper, tmp_path, budget, fragments):
    data = _recipe(tmp_path, {"accuracy": {"metric": "top1", "max_drop": budget}, "throughput": _fast()})
    _run_is_bad_input(temper, tmp_path, data, "validate.accuracy.max_drop", *fragments)


def test_relative_budget_with_mse(temper, tmp_path):
    data = _recipe(tmp_path, {"accuracy": {"metric": "mse", "max_drop": "1%"}, "throughput": _fast()})
    _run_is_bad_input(temper, tmp_path, data, "validate.accuracy", "relative max_drop", "mse", "absolute number")


@pytest.mark.parametrize("key", ["duration_s", "warmup_s"])
def test_endless_measuring_time(temper, tmp_path, key):
    data = _recipe(tmp_path, {"throughput": {**_fast(), key: float("inf")}})
    _run_is_bad_input(temper, tmp_path, data, f"validate.throughput.{key}", "finite number", "got inf")


def test_batch_size_zero(temper, tmp_path):
    data = _recipe(tmp_path, {"throughput": _fast(batch_sizes=[0, 8])})
    _run_is_bad_input(temper, tmp_path, data, "validate.throughput.batch_sizes[0]", "greater than 0", "got 0")


def test_batch_size_a_fixed_shape_candidate_cannot_take(temper, tmp_path):
    candidates = {"fixed": {"steps": [{"fix_shapes": {"dims": {"batch": 1}}}]}}
    data = _recipe(tmp_path, {"throughput": _fast(batch_sizes=[1, 8])}, candidates=candidates)
    _run_is_bad_input(temper, tmp_path, data, "validate.throughput.batch_sizes[1]",
                      "fixed:", "fixed to 1", "batch size 8")


def test_top1_on_an_evaluation_set_without_labels(temper, tmp_path):
    data = _recipe(tmp_path, {"accuracy": {"metric": "top1", "max_drop": 0.01}, "throughput": _fast()}, label=False)
    _run_is_bad_input(temper, tmp_path, data, "validate.accuracy.metric", "needs labels", "data.evaluation.label")


def test_validate_without_an_evaluation_set(temper, tmp_path):
    data = _recipe(tmp_path, {"accuracy": {"metric": "top1", "max_drop": 0.01}, "throughput": _fast()})
    data["data"] = {"calibration": {"path": "calib.npz", "batch_size": 8}}
    _run_is_bad_input(temper, tmp_path, data, "data.evaluation", "add data.evaluation")


def test_unknown_provider_lists_the_known_ones(temper, tmp_path):
    data = _recipe(tmp_path, {"throughput": _fast(providers=["gpu"])})
    _run_is_bad_input(temper, tmp_path, data, "validate.throughput.providers[0]", "'gpu'", "cpu, cuda, tensorrt")


def test_known_provider_that_is_not_installed_is_an_environment_problem(temper, tmp_path):
    if "CUDAExecutionProvider" in ort.get_available_providers():
        try:
            session = ort.InferenceSession(_model_for_probe(tmp_path), providers=["CUDAExecutionProvider"])
            active = "CUDAExecutionProvider" in session.get_providers()
        except Exception:  # noqa: BLE001 - CUDA libraries missing: the provider is listed but cannot start
            active = False
        if active:
            pytest.skip("CUDA is really active here: the provider is present")
    data = _recipe(tmp_path, {"throughput": _fast(providers=["cuda"])})
    recipe = _write(tmp_path, data)
    out = tmp_path / "out"
    result = temper("run", recipe, "--output", out)
    assert result.code == 3, (result.code, result.stderr)
    line = _one_line(result)
    assert line.startswith("error: provider 'cuda'") and "CUDAExecutionProvider" in line, line
    assert "install onnxruntime-gpu" in line or "check the CUDA" in line, line  # absent, or present but inactive
    _no_output(out)


def _model_for_probe(folder: Path) -> str:
    path = folder / "probe.onnx"
    _tiny_onnx(path, 3)
    return str(path)


def test_speedup_at_a_batch_size_that_is_not_measured(temper, tmp_path):
    data = _recipe(tmp_path, {"throughput": _fast(min_speedup=0.5, speedup_at=[32])})
    _run_is_bad_input(temper, tmp_path, data, "validate.throughput",
                      "speedup_at 32 is not one of the measured batch_sizes [1, 8]")


def test_probe_without_calibration_labels(temper, tmp_path):
    data = _recipe(tmp_path, {"accuracy": {"metric": "probe", "max_drop": 0.05}, "throughput": _fast()},
                   width=16, classes=2, calibration=True)
    _run_is_bad_input(temper, tmp_path, data, "validate.accuracy.metric", "data.calibration", "label")


def test_probe_without_any_calibration_set(temper, tmp_path):
    data = _recipe(tmp_path, {"accuracy": {"metric": "probe", "max_drop": 0.05}, "throughput": _fast()},
                   width=16, classes=2)
    _run_is_bad_input(temper, tmp_path, data, "validate.accuracy.metric", "add data.calibration with a label column")


def test_validate_command_on_a_recipe_without_validate(temper, tmp_path):
    data = _recipe(tmp_path, {})
    del data["validate"]
    recipe = _write(tmp_path, data)
    result = temper("validate", recipe, "--output", tmp_path / "out")
    assert result.code == 2, (result.code, result.stderr)
    line = _one_line(result)
    assert line.startswith(f"error: {recipe}: validate: "), line
    assert "no validate section" in line, line
    assert not (tmp_path / "out").exists()


def test_validate_command_on_a_folder_without_manifest(temper, tmp_path):
    recipe = _write(tmp_path, _recipe(tmp_path, {"throughput": _fast()}))
    folder = tmp_path / "never-run"
    folder.mkdir()
    result = temper("validate", recipe, "--output", folder)
    assert result.code == 2, (result.code, result.stderr)
    line = _one_line(result)
    assert line.startswith(f"error: {folder.resolve()}: --output: "), line
    assert "no manifest.json" in line and "temper run" in line, line
    assert list(folder.iterdir()) == [], "validate must not write into a folder it could not validate"


# The noise-aware speed gate's own settings.


@pytest.mark.parametrize("confidence", [0, 1, 1.5, -0.2])
def test_confidence_outside_zero_one(temper, tmp_path, confidence):
    data = _recipe(tmp_path, {"throughput": _fast(min_speedup=0.5, confidence=confidence)})
    _run_is_bad_input(temper, tmp_path, data, "validate.throughput.confidence", repr(confidence))


@pytest.mark.parametrize("budget", [0, -1.0])
def test_time_budget_that_is_not_positive(temper, tmp_path, budget):
    data = _recipe(tmp_path, {"throughput": _fast(min_speedup=0.5, max_duration_s=budget)})
    _run_is_bad_input(temper, tmp_path, data, "validate.throughput.max_duration_s", "greater than 0")


def test_time_budget_below_the_first_rounds(temper, tmp_path):
    data = _recipe(tmp_path, {"throughput": _fast(min_speedup=0.5, max_duration_s=0.1)})
    _run_is_bad_input(temper, tmp_path, data, "validate.throughput", "max_duration_s 0.1 is less than duration_s 0.2")


def test_unknown_inconclusive_policy(temper, tmp_path):
    data = _recipe(tmp_path, {"throughput": _fast(min_speedup=0.5, inconclusive="retry")})
    _run_is_bad_input(temper, tmp_path, data, "validate.throughput.inconclusive", "'retry'", "fail", "pass")


# Speed-gate options that would be accepted and do nothing.


def test_infinite_min_speedup(temper, tmp_path):
    """.inf can never be met: every candidate would fail its speed gate whatever it measured."""
    data = _recipe(tmp_path, {"throughput": _fast(min_speedup=float("inf"))})
    _run_is_bad_input(temper, tmp_path, data, "validate.throughput.min_speedup", "finite")


def test_empty_speedup_at(temper, tmp_path):
    data = _recipe(tmp_path, {"throughput": _fast(min_speedup=0.5, speedup_at=[])})
    _run_is_bad_input(temper, tmp_path, data, "validate.throughput", "speedup_at: [] gates no batch size",
                      "omit speedup_at")


@pytest.mark.parametrize(("key", "values", "twice"),
                         [("batch_sizes", [8, 8], "8"), ("providers", ["cpu", "cpu"], "'cpu'")])
def test_a_batch_size_or_provider_listed_twice(temper, tmp_path, key, values, twice):
    data = _recipe(tmp_path, {"throughput": _fast(**{key: values})})
    _run_is_bad_input(temper, tmp_path, data, "validate.throughput", f"{key} lists {twice} twice")


def test_inconclusive_without_a_speed_gate(temper, tmp_path):
    data = _recipe(tmp_path, {"throughput": _fast(inconclusive="pass")})
    _run_is_bad_input(temper, tmp_path, data, "validate.throughput", "add min_speedup or remove inconclusive")


def test_a_session_search_budget_without_a_search(temper, tmp_path):
    data = _recipe(tmp_path, {"throughput": _fast(session_search_s=2)})
    _run_is_bad_input(temper, tmp_path, data, "validate.throughput",
                      "add session_search: true or remove session_search_s")


@pytest.mark.parametrize("budget", [0, -1])
def test_a_session_search_budget_that_is_not_positive(temper, tmp_path, budget):
    data = _recipe(tmp_path, {"throughput": _fast(session_search=True, session_search_s=budget)})
    _run_is_bad_input(temper, tmp_path, data, "validate.throughput.session_search_s", "greater than 0")
