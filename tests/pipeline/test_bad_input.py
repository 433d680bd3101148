"""Bad input and user code at the boundary, through the installed console script: exit code 2 (3 for
the environment), one line naming the file and the key, no output folder, and `temper check` finding
everything `run` would find before building a candidate."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper

from tests.helpers import edit_recipe
from tests.validators.test_gate_errors import _recipe, _write

TEMPER = str(Path(sys.executable).parent / "temper")


def _temper(*args: object, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([TEMPER, *map(str, args)], capture_output=True, text=True, timeout=timeout)


def _bad(result: subprocess.CompletedProcess[str], recipe: Path, key: str, *fragments: str, code: int = 2) -> str:
    """Exit `code`, and the last stderr line is `error: FILE: KEY: ...` holding every fragment; before
    it only the progress log of finished steps, never a traceback."""
    assert result.returncode == code, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line.strip() for line in result.stderr.splitlines() if line.strip()]
    *before, line = lines
    assert all(b.startswith("✓ ") for b in before), result.stderr
    assert line.startswith(f"error: {recipe}: {key}: " if key else "error: "), line
    for fragment in fragments:
        assert fragment in line, line
    return line


# --- user code is a library call, never the end of temper


@pytest.fixture
def factory_recipe(digits_dir: Path) -> Path:
    return digits_dir / "digits-cnn.yaml"


@pytest.mark.slow
def test_a_factory_that_calls_sys_exit_0_is_bad_input_not_a_pass(factory_recipe, tmp_path):
    (factory_recipe.parent / "digits_model.py").write_text("import sys\n\ndef build():\n    sys.exit(0)\n")
    out = tmp_path / "out"
    _bad(_temper("run", factory_recipe, "--output", out), factory_recipe, "model.factory",
         "build() called sys.exit(0)")
    assert not out.exists()


def test_a_factory_module_that_parses_argv_at_import_sees_no_temper_options(factory_recipe, tmp_path):
    (factory_recipe.parent / "digits_model.py").write_text(
        "import argparse\nparser = argparse.ArgumentParser()\nparser.add_argument('--weights', required=True)\n"
        "parser.parse_args()\n\ndef build():\n    pass\n")
    line = _bad(_temper("check", factory_recipe), factory_recipe, "model.factory",
                "importing digits_model.py called sys.exit(2)")
    assert "usage:" not in line


# --- `temper check` is the complete pre-flight


def _tiny(tmp_path: Path, validate: dict, **kwargs) -> Path:
    return _write(tmp_path, _recipe(tmp_path, validate, **kwargs))


def test_check_finds_a_provider_this_host_lacks(tmp_path):
    recipe = _tiny(tmp_path, {"throughput": {"batch_sizes": [1], "providers": ["cuda"], "duration_s": 0.2}})
    result = _temper("check", recipe)
    assert result.returncode == 3 and "CUDAExecutionProvider" in result.stderr.strip().splitlines()[-1], result.stderr


def test_check_finds_a_missing_metric_file(tmp_path):
    recipe = _tiny(tmp_path, {"accuracy": {"metric": "mine.py:score", "max_drop": 0.1, "higher_is_better": True}})
    _bad(_temper("check", recipe), recipe, "validate.accuracy.metric", "mine.py", "not found")


def test_check_finds_an_accuracy_output_the_model_lacks(tmp_path):
    recipe = _tiny(tmp_path, {"accuracy": {"metric": "top1", "max_drop": 0.1, "output": "logits"}})
    _bad(_temper("check", recipe), recipe, "validate.accuracy.output", "no output named 'logits'", "y")


def test_check_finds_top1_on_an_embedding(tmp_path):
    recipe = _tiny(tmp_path, {"accuracy": {"metric": "top1", "max_drop": 0.1}}, width=16, classes=2)
    _bad(_temper("check", recipe), recipe, "validate.accuracy.metric", "cosine or probe")


@pytest.mark.slow
def test_run_refuses_a_batch_size_that_cannot_fit_before_building(tmp_path):
    recipe = _tiny(tmp_path, {"throughput": {"batch_sizes": [1, 1_000_000_000_000], "duration_s": 0.2}})
    out = tmp_path / "out"
    _bad(_temper("run", recipe, "--output", out), recipe, "validate.throughput.batch_sizes[1]",
         "needs", "GiB", "smaller batch size")
    assert not out.exists()
    _bad(_temper("check", recipe), recipe, "validate.throughput.batch_sizes[1]", "GiB")


@pytest.mark.slow
def test_an_unreachable_mlflow_store_is_found_before_building(tmp_path):
    data = _recipe(tmp_path, {"accuracy": {"metric": "top1", "max_drop": 0.1}})
    data["publish"] = {"mlflow": {"registered_model": "tiny"}}
    recipe = _write(tmp_path, data)
    began = time.monotonic()
    result = _temper("run", recipe, "--output", tmp_path / "out", "--tracking-uri", "http://127.0.0.1:1")
    assert result.returncode == 3, result.stderr
    assert "MLflow store http://127.0.0.1:1 does not answer" in result.stderr.strip().splitlines()[-1]
    assert time.monotonic() - began < 60 and not (tmp_path / "out").exists()


# --- wrong or silent acceptance


def test_top1_works_when_the_evaluation_set_lacks_the_highest_class(tmp_path):
    """A 3-class model evaluated on labels 0 and 1 only is still a classifier (its rows peak at 0 or 1)."""
    weight = np.array([[5.0, 0, 0], [0, 5.0, 0], [0, 0, 0], [0, 0, 0]], dtype=np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "tiny",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
                              [numpy_helper.from_array(weight, "w")])
    data = _recipe(tmp_path, {"accuracy": {"metric": "top1", "max_drop": 0.1}})
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "tiny.onnx"))
    x = np.random.default_rng(0).random((32, 4), dtype=np.float32)
    np.savez(tmp_path / "eval.npz", x=x, label=(x[:, 1] > x[:, 0]).astype(np.int64))
    result = _temper("check", _write(tmp_path, data))
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("metric, budget", [("top1", 1.5), ("top1", "250%"), ("f1", 1.0), ("cosine", 2.0)])
def test_a_budget_that_can_never_fail_is_refused(tmp_path, metric, budget):
    recipe = _tiny(tmp_path, {"accuracy": {"metric": metric, "max_drop": budget}})
    _bad(_temper("check", recipe), recipe, "validate.accuracy", "can never be exceeded")


@pytest.mark.parametrize("fidelity, key, fragment", [
    ({"cosine_min": -1}, "validate.fidelity.cosine_min", "a cosine is never below -1"),
    ({"atol": float("inf")}, "validate.fidelity.atol", "no finite error exceeds it"),
    ({"rel_l2_max": float("inf")}, "validate.fidelity.rel_l2_max", "no finite error exceeds it"),
    ({"slices": [{"output": "y", "axis": 1, "cosine_min": -1.0}]}, "validate.fidelity.slices[0].cosine_min",
     "a cosine is never below -1"),
], ids=["cosine_min", "atol", "rel_l2_max", "slice"])
def test_a_fidelity_bound_that_can_never_fail_is_refused(tmp_path, fidelity, key, fragment):
    """As vacuous accuracy budgets and speed-gate options are: `check` passed a gate every candidate passes."""
    recipe = _tiny(tmp_path, {"fidelity": fidelity})
    _bad(_temper("check", recipe), recipe, key, fragment, "could never fail")


def test_a_declared_shape_the_onnx_model_contradicts(tmp_path):
    data = _recipe(tmp_path, {})
    data["model"]["inputs"] = [{"name": "x", "shape": ["batch", 3]}]
    recipe = _write(tmp_path, data)
    _bad(_temper("check", recipe), recipe, "model.inputs[0].shape", "declared ['batch', 3]", "['batch', 4]")


def test_a_declared_shape_the_data_contradicts(factory_recipe):
    edit_recipe(factory_recipe, lambda d: d["model"]["inputs"][0].update(shape=["batch", 3, 8, 8]))
    _bad(_temper("check", factory_recipe), factory_recipe, "model.inputs[0].shape", "has 1 at axis 1")


def test_text_data_for_a_float_input_says_to_preprocess(tmp_path):
    data = _recipe(tmp_path, {})
    (tmp_path / "text.csv").write_text("x,label\nhello,1\nworld,0\n")
    data["data"]["evaluation"] = {"path": "text.csv", "label": "label"}
    recipe = _write(tmp_path, data)
    line = _bad(_temper("check", recipe), recipe, "data.evaluation", "text data", "preprocess")
    assert "\x1b[" not in line


def test_fractional_data_for_an_integer_input(tmp_path):
    data = _recipe(tmp_path, {})
    data["model"]["inputs"][0]["dtype"] = "int64"
    recipe = _write(tmp_path, data)
    _bad(_temper("check", recipe), recipe, "model.inputs[0].dtype", "fractional float32 values")


@pytest.mark.parametrize("text, what", [("", "is empty"), ("x,label\n", "has a header but no rows")])
def test_an_empty_or_header_only_csv(tmp_path, text, what):
    data = _recipe(tmp_path, {})
    (tmp_path / "calib.csv").write_text(text)
    data["data"]["calibration"] = {"path": "calib.csv"}
    recipe = _write(tmp_path, data)
    _bad(_temper("check", recipe), recipe, "data.calibration.path", what)


def test_a_key_given_twice_is_refused(tmp_path):
    recipe = _write(tmp_path, _recipe(tmp_path, {}))
    recipe.write_text(recipe.read_text() + "name: tiny2\n")
    _bad(_temper("check", recipe), recipe, "", "duplicate key 'name'")


@pytest.mark.parametrize("value", [True, 2.5, "8"])
def test_a_batch_size_of_the_wrong_type(tmp_path, value):
    data = _recipe(tmp_path, {})
    data["data"]["evaluation"]["batch_size"] = value
    recipe = _write(tmp_path, data)
    _bad(_temper("check", recipe), recipe, "data.evaluation.batch_size", repr(value))


# --- models nobody here wrote: unnamed dims, old opsets


def _ocr_like(path: Path, opset: int) -> None:
    """x [-1, 3, '?', '?'] -> Conv -> y, the shape pretrained OCR detectors are exported with."""
    weight = numpy_helper.from_array(np.random.default_rng(0).normal(0, 0.1, (4, 3, 3, 3)).astype(np.float32), "w")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3, "?", "?"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [-1, 4, "?", "?"])
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1], name="conv")],
                              "ocr", [x], [y], [weight])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), str(path))


def _ocr_recipe(tmp_path: Path, opset: int, candidates: dict) -> Path:
    _ocr_like(tmp_path / "ocr.onnx", opset)
    np.save(tmp_path / "images.npy", np.random.default_rng(1).random((8, 3, 48, 192), dtype=np.float32))
    data = {"version": 1, "name": "ocr",
            "model": {"onnx": "ocr.onnx", "inputs": [{"name": "x", "shape": ["batch", 3, "h", "w"]}], "outputs": ["y"]},
            "data": {"calibration": {"path": "images.npy", "batch_size": 4}},
            "candidates": candidates}
    path = tmp_path / "ocr.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_unnamed_dims_are_set_per_axis(tmp_path):
    recipe = _ocr_recipe(tmp_path, 17, {"fixed": {"steps": [{"fix_shapes": {"inputs": {"x": [1, 3, 48, 192]}}}]}})
    result = _temper("run", recipe, "--output", tmp_path / "out")
    assert result.returncode == 0, result.stderr
    fixed = onnx.load(str(tmp_path / "out" / "fixed" / "model.onnx"))
    assert [d.dim_value for d in fixed.graph.input[0].type.tensor_type.shape.dim] == [1, 3, 48, 192]


def test_the_unnamed_placeholder_is_not_a_dim_name(tmp_path):
    recipe = _ocr_recipe(tmp_path, 17, {"fixed": {"steps": [{"fix_shapes": {"dims": {"?": 48}}}]}})
    _bad(_temper("check", recipe), recipe, "candidates.fixed.steps[0].fix_shapes.dims.?", "set them per axis")


def test_per_channel_static_int8_upgrades_an_opset_11_model(tmp_path):
    recipe = _ocr_recipe(tmp_path, 11, {"int8": {"steps": [{"quantize": {"mode": "static", "per_channel": True}}]}})
    result = _temper("run", recipe, "--output", tmp_path / "out")
    assert result.returncode == 0, result.stderr
    model = onnx.load(str(tmp_path / "out" / "int8" / "model.onnx"))
    assert {o.version for o in model.opset_import if o.domain in ("", "ai.onnx")} == {13}
    assert "DequantizeLinear" in {n.op_type for n in model.graph.node}


def test_a_dtype_the_module_cannot_take_names_the_inputs_not_the_exporter(factory_recipe):
    """Token ids declared float32 for an embedding: the module itself fails, so the advice is about
    model.inputs, not about switching exporters, and carries no terminal colour codes."""
    (factory_recipe.parent / "digits_model.py").write_text(
        "import torch\n\nclass Ids(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.embed = torch.nn.Embedding(17, 10)\n\n    def forward(self, pixels):\n"
        "        return self.embed(pixels).mean(dim=(1, 2, 3))\n\ndef build():\n    return Ids()\n")
    line = _bad(_temper("check", factory_recipe), factory_recipe, "model.inputs",
                "does not run on a batch of the declared inputs", "pixels float32")
    assert "dynamo" not in line and "\x1b[" not in line
