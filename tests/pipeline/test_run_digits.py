"""`temper run` end to end on the real digits recipe: outputs, manifest, cache reuse, failures."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from temper.artifacts.formats.integrity import sha256_of
from tests.helpers import edit_recipe


@pytest.fixture
def digits(digits_dir: Path, module_cache: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The digits recipe without its gates and publishing: these tests are about building."""
    monkeypatch.setenv("TEMPER_CACHE_DIR", str(module_cache))  # tests here build on each other's cache
    recipe = digits_dir / "digits-cnn.yaml"
    edit_recipe(recipe, lambda d: [d.pop(key) for key in ("validate", "select", "publish")])
    return recipe


def _manifest(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())


def _test_images() -> tuple[np.ndarray, np.ndarray]:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "recipes"))
    from digits_data import test

    data = test()
    return data["pixels"], data["label"]


@pytest.mark.slow
def test_run_writes_every_candidate_and_a_truthful_manifest(temper, digits, tmp_path):
    out = tmp_path / "out"
    result = temper("run", digits, "--output", out)
    assert result.code == 0, result.stderr
    for name in ("baseline", "fp16", "int8-static", "int8-dynamic"):
        assert name in result.stdout  # the summary table lists each model
        onnx.checker.check_model(str(out / name / "model.onnx"))
    manifest = _manifest(out)
    models = {m["id"]: m for m in manifest["models"]}
    assert models["source"]["step"] == "export" and models["source"]["parent"] is None
    assert models["baseline/1-simplify"]["parent"] == "source"
    assert models["int8-static/1-quantize"]["parent"] == "baseline/1-simplify"
    assert models["int8-static/1-quantize"]["options"]["calibration"] == "entropy"
    for name, entry in manifest["candidates"].items():
        assert entry["status"] == "ok"
        assert models[entry["model"]]["sha256"] == sha256_of(out / name / "model.onnx")
    assert {"torch", "onnx", "onnxruntime", "onnxsim"} <= set(manifest["versions"])

    # The candidates really are what they claim, and still classify the held-out digits.
    images, labels = _test_images()
    fp16 = onnx.load(str(out / "fp16" / "model.onnx"))
    assert any(t.data_type == onnx.TensorProto.FLOAT16 for t in fp16.graph.initializer)
    static_ops = {n.op_type for n in onnx.load(str(out / "int8-static" / "model.onnx")).graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= static_ops
    for name in ("baseline", "fp16", "int8-static", "int8-dynamic"):
        session = ort.InferenceSession(str(out / name / "model.onnx"), providers=["CPUExecutionProvider"])
        accuracy = (session.run(None, {"pixels": images})[0].argmax(1) == labels).mean()
        assert accuracy > 0.95, (name, accuracy)


@pytest.mark.slow
def test_rerun_reuses_every_step_and_one_change_rebuilds_only_downstream(temper, digits, tmp_path):
    assert temper("run", digits, "--output", tmp_path / "a").code == 0
    again = temper("run", digits, "--output", tmp_path / "b")
    assert again.code == 0
    second = _manifest(tmp_path / "b")
    assert all(m["cached"] for m in second["models"]), second["models"]
    first_hashes = {m["id"]: m["sha256"] for m in _manifest(tmp_path / "a")["models"]}
    assert first_hashes == {m["id"]: m["sha256"] for m in second["models"]}

    edit_recipe(digits, lambda d: d["candidates"]["int8-static"]["steps"][0]["quantize"].update(calibration="minmax"))
    assert temper("run", digits, "--output", tmp_path / "c").code == 0
    cached = {m["id"]: m["cached"] for m in _manifest(tmp_path / "c")["models"]}
    assert cached == {"source": True, "baseline/1-simplify": True, "fp16/1-fp16": True,
                      "int8-static/1-quantize": False, "int8-dynamic/1-quantize": True}


@pytest.mark.slow
def test_no_cache_rebuilds_everything(temper, digits, tmp_path):
    assert temper("run", digits, "--output", tmp_path / "a", "--no-cache").code == 0
    assert not any(m["cached"] for m in _manifest(tmp_path / "a")["models"])


@pytest.mark.slow
def test_failed_candidate_is_reported_and_others_still_written(temper, digits, tmp_path):
    # A value FP16 cannot hold: the fp16 candidate must fail its NaN/Inf check, not pass quietly.
    edit_recipe(digits, lambda d: d["data"]["evaluation"].update(preprocess="huge.py:scale"))
    (digits.parent / "huge.py").write_text("def scale(cols):\n    return {'pixels': cols['pixels'] * 1e6}\n")
    edit_recipe(digits, lambda d: d["candidates"].update(
        {"fp16": {"steps": [{"fp16": {"keep_io_types": True, "op_block_list": []}}]}}))
    result = temper("run", digits, "--output", tmp_path / "out")
    assert result.code == 1
    assert "candidate fp16" in result.stderr
    manifest = _manifest(tmp_path / "out")
    assert manifest["candidates"]["fp16"]["status"] == "failed"
    assert not (tmp_path / "out" / "fp16").exists()
    assert (tmp_path / "out" / "int8-static" / "model.onnx").is_file()


def test_check_validates_without_building_candidates(temper, digits, tmp_path):
    result = temper("check", digits)
    assert result.code == 0, result.stderr
    assert "ok" in result.stdout and "calibration: 16 full batches" in result.stdout


def test_the_flow_runs_as_a_library_without_the_cli(digits, tmp_path):
    """pipeline.flow is what `temper run` calls: a notebook or another tool gets the same folder and exit code."""
    from temper.artifacts.core.errors import RecipeError
    from temper.pipeline import flow
    from temper.pipeline.cache import StepCache, default_root
    from temper.pipeline.loading import load_recipe

    loaded = load_recipe(digits)
    outcome = flow.run(loaded, tmp_path / "lib", StepCache(default_root()), require=["fp16"])
    assert outcome.exit_code == 0 and outcome.report is None and outcome.missed == []
    assert outcome.folder == (tmp_path / "lib").resolve()
    assert (outcome.folder / "fp16" / "model.onnx").is_file() and _manifest(outcome.folder)["candidates"]["fp16"]
    assert [c.name for c in outcome.result.candidates] == ["fp16", "int8-static", "int8-dynamic"]
    with pytest.raises(RecipeError, match="--require: no candidate named 'nope'"):
        flow.run(loaded, tmp_path / "never", StepCache(default_root()), require=["nope"])
    assert not (tmp_path / "never").exists()
