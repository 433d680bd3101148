"""Configuration search and presets on the real digits recipe: every combination is built,
validated and reported; the presets really change the written graph."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import onnx
import pytest
from onnx import TensorProto

from temper.pipeline.quantize_backends import OrtOptions
from tests.helpers import REPO, edit_recipe
from tests.unit.reports import read_report


def _int8_initializer_types(path: Path) -> set[int]:
    model = onnx.load(str(path))
    return {i.data_type for i in model.graph.initializer if i.data_type in (TensorProto.INT8, TensorProto.UINT8)}


@pytest.mark.slow
def test_a_search_builds_each_combination_up_to_max_trials_and_selects_the_fastest_passing(
    temper, gated_digits, tmp_path
):
    def search(d: dict) -> None:
        d["candidates"] = {"int8": {"max_trials": 3, "steps": [
            {"quantize": {"mode": "static", "preset": ["avx512_vnni", "avx2"], "format": ["qdq", "qoperator"]}}]}}
        del d["publish"]

    edit_recipe(gated_digits, search)
    out = tmp_path / "out"
    result = temper("run", gated_digits, "--output", out)
    assert result.code in (0, 1), result.stderr
    report = read_report(out)
    trials = ["int8.preset-avx512_vnni.format-qdq", "int8.preset-avx512_vnni.format-qoperator",
              "int8.preset-avx2.format-qdq"]
    assert report["searches"] == {"int8": {"trials": trials, "combinations": 4}}
    assert list(report["candidates"]) == trials  # the 4th combination was not built

    for name in trials:
        model = out / name / "model.onnx"
        ops = {n.op_type for n in onnx.load(str(model)).graph.node}
        if name.endswith("qoperator"):
            assert "QLinearConv" in ops
        else:
            assert {"QuantizeLinear", "DequantizeLinear"} <= ops and "QLinearConv" not in ops
        types = _int8_initializer_types(model)
        if "avx2" in name:  # u8 weights and u8 activation zero points: no s8 tensor anywhere
            assert types == {TensorProto.UINT8}
        else:  # VNNI: s8 weights, u8 activations
            assert types == {TensorProto.INT8, TensorProto.UINT8}

    # The selection rule: of the passing trials whose speedup interval at the ranking batch size lies above
    # 1.0, the largest speedup, or one tied with it on their paired interval (the more faithful); else the baseline.
    ranked = {n: max(c["throughput"], key=lambda m: m["batch_size"]) for n, c in report["candidates"].items()
              if c["passed"]}
    faster = {n: m["speedup"] for n, m in ranked.items() if m["speedup_interval"][0] > 1.0}
    if faster:
        leader, tied = max(faster, key=faster.__getitem__), {t["pair"] for t in report["ties"]}
        assert report["selected"] == leader or (report["selected"] in faster and leader in tied)
    else:
        assert report["selected"] == "baseline" and result.code == 0
    markdown = (out / "report.md").read_text()
    assert "## Search: int8 (3 of 4 combinations built)" in markdown
    assert "1 combinations not built: raise max_trials" in markdown


@pytest.mark.slow
def test_require_with_the_search_name_passes_when_one_combination_passes(temper, gated_digits, tmp_path):
    def search(d: dict) -> None:
        d["candidates"] = {"int8": {"steps": [{"quantize": {"mode": "static", "per_channel": [True, False]}}]},
                           "int8-dynamic": d["candidates"]["int8-dynamic"]}
        d["validate"]["throughput"]["min_speedup"] = 0.05  # every INT8 build passes speed; accuracy decides
        del d["publish"]

    edit_recipe(gated_digits, search)
    out = tmp_path / "out"
    result = temper("run", gated_digits, "--output", out, "--require", "int8")
    report = read_report(out)
    trials = report["searches"]["int8"]["trials"]
    assert any(report["candidates"][t]["passed"] for t in trials)
    assert result.code == 0, result.stderr


def test_a_preset_fills_only_what_the_step_leaves_unset():
    options = OrtOptions(mode="static", preset="avx2", per_channel=False)
    assert (options.activation_type, options.weight_type, options.per_channel) == ("uint8", "uint8", False)
    dynamic = OrtOptions(mode="dynamic", preset="arm64")  # static-only settings are not applied
    assert (dynamic.weight_type, dynamic.per_channel, dynamic.activation_type) == ("int8", True, "int8")
    assert "activation_type" not in dynamic.model_fields_set


def test_the_tensorrt_preset_writes_symmetric_int8_with_a_qdq_pair_on_every_weight(temper, gated_digits, tmp_path):
    def trt(d: dict) -> None:
        d["candidates"] = {"trt": {"steps": [{"quantize": {"mode": "static", "preset": "tensorrt"}}]}}
        del d["publish"], d["validate"]

    edit_recipe(gated_digits, trt)
    out = tmp_path / "out"
    assert temper("run", gated_digits, "--output", out).code == 0
    model = onnx.load(str(out / "trt" / "model.onnx"))
    inits = {i.name: i for i in model.graph.initializer}
    quantize = [n for n in model.graph.node if n.op_type == "QuantizeLinear"]
    for node in quantize:
        zero_point = onnx.numpy_helper.to_array(inits[node.input[2]])
        assert inits[node.input[2]].data_type == TensorProto.INT8 and not zero_point.any(), node.name
    weights = [n for n in quantize if n.input[0] in inits and inits[n.input[0]].data_type == TensorProto.FLOAT]
    convs = [n for n in model.graph.node if n.op_type in ("Conv", "Gemm", "MatMul")]
    assert len(weights) >= len(convs) > 0  # float weights quantized in-graph: TensorRT fuses each layer itself


SHIPPED = sorted((REPO / "recipes").glob("*.yaml"))


def test_every_shipped_recipe_matches_the_published_schema(temper):
    """The recipes in recipes/ are what users copy: the JSON Schema that `temper schema` prints accepts
    each of them (lists of alternatives and null presets included)."""
    import yaml

    schema = json.loads(temper("schema").stdout)
    assert len(SHIPPED) >= 4
    for recipe in SHIPPED:
        jsonschema.validate(yaml.safe_load(recipe.read_text()), schema)


@pytest.mark.parametrize("recipe", [
    # check builds the baseline: a MiniLM export and its probe take minutes and GiBs, so those run in make test
    pytest.param(r, id=r.stem, marks=[pytest.mark.slow] if r.stem.startswith("minilm") else []) for r in SHIPPED])
def test_every_shipped_recipe_passes_check(temper, recipe, minilm_cache, monkeypatch):
    """Each shipped recipe loads and its references resolve (`temper check`); the MiniLM recipes share
    one export with the run's other MiniLM tests."""
    monkeypatch.setenv("TEMPER_CACHE_DIR", str(minilm_cache))
    result = temper("check", recipe)
    assert result.code == 0, f"{recipe.name}: {result.stderr}"
