"""Bad input found while running (files, factories, graphs, data, output folder): one line, exit 2,
and no output folder left behind that could pass for a finished run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper


def _write(folder: Path, data: dict) -> Path:
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _tiny_onnx(path: Path) -> None:
    weight = numpy_helper.from_array(np.random.default_rng(0).random((4, 3), dtype=np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="matmul_0")], "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])], [weight],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def _onnx_recipe(folder: Path, **changes) -> dict:
    _tiny_onnx(folder / "tiny.onnx")
    np.savez(folder / "calib.npz", x=np.random.default_rng(1).random((64, 4), dtype=np.float32))
    recipe = {
        "version": 1, "name": "tiny",
        "model": {"onnx": "tiny.onnx", "inputs": [{"name": "x", "shape": ["batch", 4]}], "outputs": ["y"]},
        "data": {"calibration": {"path": "calib.npz", "batch_size": 16}},
        "candidates": {"int8": {"steps": [{"quantize": {"mode": "static"}}]}},
    }
    recipe.update(changes)
    return recipe


def _assert_bad_input(result, recipe: Path, key: str, fragment: str, out: Path | None = None) -> None:
    assert result.code == 2, (result.code, result.stderr)
    line = result.stderr.strip()
    assert "\n" not in line and "Traceback" not in line, result.stderr
    assert line.startswith(f"error: {recipe}: {key}: "), line
    assert fragment in line, line
    if out is not None:
        assert not out.exists(), "a failed run must not leave an output folder"
        assert not list(out.parent.glob(f".{out.name}.partial-*")), "staging folder left behind"


def test_tiny_onnx_recipe_runs(temper, tmp_path):
    out = tmp_path / "out"
    result = temper("run", _write(tmp_path, _onnx_recipe(tmp_path)), "--output", out)
    assert result.code == 0, result.stderr
    assert (out / "int8" / "model.onnx").is_file()


def test_missing_factory_file(temper, digits_dir, tmp_path):
    recipe = digits_dir / "digits-cnn.yaml"
    (digits_dir / "digits_model.py").unlink()
    out = tmp_path / "out"
    _assert_bad_input(temper("run", recipe, "--output", out), recipe, "model.factory",
                      "digits_model.py' not found", out)


def test_missing_factory_function(temper, digits_dir):
    recipe = digits_dir / "digits-cnn.yaml"
    recipe.write_text(recipe.read_text().replace("digits_model.py:build", "digits_model.py:make"))
    _assert_bad_input(temper("check", recipe), recipe, "model.factory", "has no function 'make' (it has: ")


def test_factory_that_raises(temper, digits_dir, tmp_path):
    recipe = digits_dir / "digits-cnn.yaml"
    (digits_dir / "digits_cnn.pt").write_bytes(b"not a checkpoint")
    out = tmp_path / "out"
    _assert_bad_input(temper("run", recipe, "--output", out), recipe, "model.factory", "build() raised", out)


def test_invalid_onnx_file(temper, tmp_path):
    recipe = _write(tmp_path, _onnx_recipe(tmp_path))
    (tmp_path / "tiny.onnx").write_bytes(b"\x08\x07garbage that is not protobuf")
    out = tmp_path / "out"
    _assert_bad_input(temper("run", recipe, "--output", out), recipe, "model.onnx", "is not a valid ONNX model", out)


def test_input_name_not_in_model(temper, tmp_path):
    data = _onnx_recipe(tmp_path)
    data["model"]["inputs"][0]["name"] = "pixels"
    recipe = _write(tmp_path, data)
    _assert_bad_input(temper("check", recipe), recipe, "model.inputs[0].name",
                      "'pixels' is not an input of tiny.onnx; its inputs: x")


def test_dim_name_not_in_model_lists_real_ones(temper, tmp_path):
    data = _onnx_recipe(tmp_path, candidates={"fixed": {"steps": [{"fix_shapes": {"dims": {"batsh": 1}}}]}})
    recipe = _write(tmp_path, data)
    _assert_bad_input(temper("check", recipe), recipe, "candidates.fixed.steps[0].fix_shapes.dims.batsh", "batch")
    out = tmp_path / "out"
    _assert_bad_input(temper("run", recipe, "--output", out), recipe,
                      "candidates.fixed.steps[0].fix_shapes.dims.batsh", "batch", out)


def test_node_to_exclude_not_in_graph(temper, tmp_path):
    data = _onnx_recipe(tmp_path, candidates={"int8": {"steps": [
        {"quantize": {"mode": "static", "exclude_nodes": ["matmul_O"]}}]}})
    recipe = _write(tmp_path, data)
    key = "candidates.int8.steps[0].quantize.exclude_nodes[0]"
    _assert_bad_input(temper("check", recipe), recipe, key, "matmul_0")
    out = tmp_path / "out"
    _assert_bad_input(temper("run", recipe, "--output", out), recipe, key, "matmul_0", out)


@pytest.mark.parametrize("rows", [0, 10])
def test_calibration_set_empty_or_smaller_than_a_batch(temper, tmp_path, rows):
    recipe = _write(tmp_path, _onnx_recipe(tmp_path))
    np.savez(tmp_path / "calib.npz", x=np.ones((rows, 4), np.float32))
    key, fragment = (("data.calibration", "empty") if rows == 0
                     else ("data.calibration.batch_size", "fewer than one batch of 16"))
    out = tmp_path / "out"
    _assert_bad_input(temper("run", recipe, "--output", out), recipe, key, fragment, out)
    _assert_bad_input(temper("check", recipe), recipe, key, fragment)


def test_output_folder_not_writable(temper, tmp_path):
    recipe = _write(tmp_path, _onnx_recipe(tmp_path))
    blocker = tmp_path / "file"
    blocker.write_text("a file where a folder should be")
    result = temper("run", recipe, "--output", blocker / "out")
    assert result.code == 2
    assert result.stderr.strip().startswith(f"error: {blocker / 'out'}: --output: not writable")


def test_output_folder_that_is_not_ours_is_not_replaced(temper, tmp_path):
    recipe = _write(tmp_path, _onnx_recipe(tmp_path))
    out = tmp_path / "precious"
    out.mkdir()
    (out / "thesis.tex").write_text("keep me")
    result = temper("run", recipe, "--output", out)
    assert result.code == 2 and "holds no temper manifest.json" in result.stderr
    assert (out / "thesis.tex").read_text() == "keep me"
