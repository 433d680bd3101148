"""One model file on two engines (issue 33.1): where its outputs on OpenVINO disagree with its outputs on ONNX
Runtime beyond the fidelity budget, report.json, report.md and the console say so. The model's class-score
rows pass Tanh's result through a large gain and Sin, so the engines' last-bit differences in Tanh (OpenVINO's
and ONNX Runtime's kernels differ in most values) become different scores, while the box rows agree."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper

from tests.unit.reports import read_report

pytest.importorskip("openvino")


def _model(path: Path) -> None:
    """out = concat(x @ wb (hundreds), sigmoid(sin(tanh(tile(x) * c) * 2**26))): [batch, 4 + 16]."""
    rng = np.random.default_rng(0)
    wb = (rng.random((4, 4)) * 300).astype(np.float32)
    c = rng.random((1, 16), dtype=np.float32) + 0.5
    nodes = [helper.make_node("MatMul", ["x", "wb"], ["boxes"]),
             helper.make_node("Tile", ["x", "reps"], ["wide"]),
             helper.make_node("Mul", ["wide", "c"], ["u"]),
             helper.make_node("Tanh", ["u"], ["t"]),
             helper.make_node("Mul", ["t", "gain"], ["big"]),
             helper.make_node("Sin", ["big"], ["s"]),
             helper.make_node("Sigmoid", ["s"], ["scores"]),
             helper.make_node("Concat", ["boxes", "scores"], ["out"], axis=1)]
    graph = helper.make_graph(nodes, "engines", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", 20])],
                              [numpy_helper.from_array(wb, "wb"), numpy_helper.from_array(c, "c"),
                               numpy_helper.from_array(np.array([1, 4], np.int64), "reps"),
                               numpy_helper.from_array(np.array(2.0 ** 26, np.float32), "gain")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))


def test_a_file_that_computes_differently_on_two_engines_is_named(temper, tmp_path):
    _model(tmp_path / "m.onnx")
    rng = np.random.default_rng(1)
    np.savez(tmp_path / "eval.npz", x=rng.random((64, 4), dtype=np.float32) * 3)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({
        "version": 1, "name": "engines",
        "model": {"onnx": "m.onnx", "inputs": [{"name": "x", "shape": ["batch", 4]}], "outputs": ["out"]},
        "data": {"evaluation": {"path": "eval.npz", "batch_size": 16}},
        "candidates": {"int8-dynamic": {"steps": [{"quantize": {"mode": "dynamic"}}]}},
        "validate": {"fidelity": {"cosine_min": 0.99},
                     "throughput": {"providers": ["cpu", "openvino"], "batch_sizes": [1], "duration_s": 0.1,
                                    "warmup_s": 0.01}}}, sort_keys=False))
    out = tmp_path / "out"
    result = temper("run", recipe, "--output", out)
    assert result.code == 0, result.stderr
    report = read_report(out)
    found = {(d["model"], d["engine"], d["other"]): d for d in report["engine_disagreements"]}
    assert ("int8-dynamic", "cpu", "openvino") in found, report["engine_disagreements"]
    assert ("baseline", "cpu", "openvino") in found  # the FP32 file too: the engines, not the quantizer
    miss = found[("int8-dynamic", "cpu", "openvino")]
    assert any(m.startswith("worst row cosine to baseline (out[axis 1] index ") for m in miss["missed"]), miss
    assert miss["comparisons"][0]["worst_row"]["index"] >= 4  # a score row; the boxes agree
    stderr = " ".join(result.stderr.split())
    assert "engines disagree: int8-dynamic computes differently on openvino than on cpu" in stderr, stderr
    assert "**engines disagree**: int8-dynamic computes differently on openvino than on cpu" in (
        out / "report.md").read_text()
