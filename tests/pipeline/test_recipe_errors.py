"""Schema-level bad input: each mistake is one line naming the file and key path, exit code 2."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.helpers import RECIPES


def _write(folder: Path, data: dict | str) -> Path:
    path = folder / "recipe.yaml"
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return path


def _digits() -> dict:
    return yaml.safe_load((RECIPES / "digits-cnn.yaml").read_text())


def _assert_one_line(result, path: Path, key: str, *fragments: str) -> None:
    assert result.code == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"error: {path}: {key}: "), lines[0]
    for fragment in fragments:
        assert fragment in lines[0]
    assert "Traceback" not in result.stderr


def test_yaml_syntax_error_names_line(temper, tmp_path):
    path = _write(tmp_path, "version: 1\nname: x\nmodel: {factory: a.py:b\n")
    result = temper("check", path)
    assert result.code == 2
    assert result.stderr.startswith(f"error: {path}: line ")
    assert "YAML syntax error" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_unknown_key_suggests_closest(temper, tmp_path):
    data = _digits()
    data["candidates"]["int8-static"]["steps"][0]["quantize"]["calibraton"] = "entropy"
    del data["candidates"]["int8-static"]["steps"][0]["quantize"]["calibration"]
    path = _write(tmp_path, data)
    _assert_one_line(temper("check", path), path, "candidates.int8-static.steps[0].quantize.calibraton",
                     "unknown key 'calibraton'", "did you mean 'calibration'")


def test_unknown_step_name_suggests_closest(temper, tmp_path):
    data = _digits()
    data["steps"] = ["simplfy"]
    path = _write(tmp_path, data)
    _assert_one_line(temper("run", path), path, "steps[0].simplfy", "did you mean 'simplify'")


def test_unknown_calibration_method_lists_choices(temper, tmp_path):
    data = _digits()
    data["candidates"]["int8-static"]["steps"][0]["quantize"]["calibration"] = "entrophy"
    path = _write(tmp_path, data)
    _assert_one_line(temper("run", path), path, "candidates.int8-static.steps[0].quantize.calibration",
                     "'entrophy' is not one of minmax, entropy, percentile")


def test_wrong_type(temper, tmp_path):
    data = _digits()
    data["data"]["calibration"]["batch_size"] = "many"
    path = _write(tmp_path, data)
    _assert_one_line(temper("check", path), path, "data.calibration.batch_size", "integer", "'many'")


def test_bad_dim_and_missing_section(temper, tmp_path):
    data = _digits()
    data["model"]["inputs"][0]["shape"][0] = 0
    path = _write(tmp_path, data)
    _assert_one_line(temper("check", path), path, "model.inputs[0].shape[0]", "positive integer or a symbolic name")
    data["model"]["inputs"][0]["shape"][0] = "batch"
    del data["candidates"]
    _assert_one_line(temper("check", path := _write(tmp_path, data)), path, "candidates", "missing required key")


def test_option_for_the_other_mode_is_rejected(temper, tmp_path):
    data = _digits()
    data["candidates"]["int8-dynamic"]["steps"][0]["quantize"]["calibration"] = "entropy"
    path = _write(tmp_path, data)
    _assert_one_line(temper("check", path), path, "candidates.int8-dynamic.steps[0].quantize",
                     "'calibration': only for mode: static")


def test_missing_recipe_file(temper, tmp_path):
    result = temper("run", tmp_path / "nope.yaml")
    assert result.code == 2 and result.stderr.strip() == f"error: {tmp_path / 'nope.yaml'}: file not found"


@pytest.mark.parametrize("name", ["baseline", "Big Name"])
def test_candidate_names(temper, tmp_path, name):
    data = _digits()
    data["candidates"][name] = data["candidates"].pop("fp16")
    path = _write(tmp_path, data)
    result = temper("check", path)
    assert result.code == 2 and len(result.stderr.strip().splitlines()) == 1
    assert ("reserved" if name == "baseline" else "not a valid name") in result.stderr


def test_schema_command_prints_json_schema(temper):
    import json

    result = temper("schema")
    assert result.code == 0
    schema = json.loads(result.stdout)
    assert schema["title"] == "Recipe"
    assert {"version", "name", "model", "candidates"} <= set(schema["required"])
    assert {"OrtOptions", "ModelOptOptions", "NncfOptions"} <= set(schema["$defs"])  # quantize: one per backend
