"""NNCF's CNN INT8 on ONNX Runtime (issue 33.6), through the console script: NNCF places each activation's
Q/DQ after a SiLU (YOLOv8's activation), so no Conv output is quantized where ONNX Runtime could fuse the group
into an INT8 kernel, and every Conv runs in float on dequantized values. The gate table's verdict comes with
that count, beside it; ONNX Runtime's own quantizer, whose Q/DQ sits on each Conv's output, has no such line."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper

from tests.pipeline.test_console_log import temper

pytest.importorskip("nncf")


def silu_cnn(path: Path) -> None:
    """x[batch, 3, 16, 16] -> three Conv + SiLU (Sigmoid, Mul) -> GlobalAveragePool -> y[batch, 8]."""
    rng = np.random.default_rng(0)
    nodes, inits, previous, channels = [], [], "x", [3, 8, 8, 8]
    for i in range(3):
        inits += [numpy_helper.from_array(rng.normal(0, 0.3, (channels[i + 1], channels[i], 3, 3)).astype(np.float32),
                                          f"w{i}"),
                  numpy_helper.from_array(rng.normal(0, 0.1, channels[i + 1]).astype(np.float32), f"b{i}")]
        nodes += [helper.make_node("Conv", [previous, f"w{i}", f"b{i}"], [f"c{i}"], name=f"conv{i}", pads=[1, 1, 1, 1]),
                  helper.make_node("Sigmoid", [f"c{i}"], [f"s{i}"], name=f"sigmoid{i}"),
                  helper.make_node("Mul", [f"c{i}", f"s{i}"], [f"a{i}"], name=f"silu{i}")]
        previous = f"a{i}"
    nodes += [helper.make_node("GlobalAveragePool", [previous], ["g"], name="pool"),
              helper.make_node("Flatten", ["g"], ["y"], name="flatten")]
    graph = helper.make_graph(nodes, "cnn",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def test_the_gate_table_says_how_many_quantized_nodes_onnx_runtime_runs_in_int8(tmp_path):
    silu_cnn(tmp_path / "cnn.onnx")
    rng = np.random.default_rng(1)
    for name in ("calib", "eval"):
        np.savez(tmp_path / f"{name}.npz", x=rng.normal(0, 1, (32, 3, 16, 16)).astype(np.float32))
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({
        "version": 1, "name": "cnn",
        "model": {"onnx": "cnn.onnx", "inputs": [{"name": "x", "shape": ["batch", 3, 16, 16]}], "outputs": ["y"]},
        "data": {"calibration": {"path": "calib.npz", "batch_size": 16},
                 "evaluation": {"path": "eval.npz", "batch_size": 16}},
        "candidates": {"int8-nncf": {"steps": [{"quantize": {"mode": "static", "backend": "nncf"}}]},
                       "int8-ort": {"steps": [{"quantize": {"mode": "static"}}]}},
        "validate": {"fidelity": {"cosine_min": 0.9}},
    }, sort_keys=False))
    result = temper("run", recipe, "--output", tmp_path / "out", "--cache-dir", tmp_path / "cache")
    assert result.returncode == 0, result.stderr
    said = " ".join(result.stdout.split())
    found = re.search(r"int8-nncf (pass|FAIL): ONNX Runtime runs (\d+) of (\d+) quantized nodes in INT8 ", said)
    assert found is not None, said
    assert int(found.group(2)) < int(found.group(3)) == 3, found.group(0)  # three Convs quantized by the graph
    assert "int8-ort pass: ONNX Runtime runs" not in said and "int8-ort FAIL: ONNX Runtime runs" not in said, said
