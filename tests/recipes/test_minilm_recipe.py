"""The shipped MiniLM recipe end to end: real model, real texts, every candidate checked for what it claims."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from tests.conftest import RECIPES

pytestmark = pytest.mark.slow


def _embed(path, feed):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, feed)[0]


def test_minilm_recipe_builds_faithful_candidates(temper, tmp_path):
    out = tmp_path / "out"
    result = temper("run", RECIPES / "minilm.yaml", "--output", out)
    assert result.code == 0, result.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert set(manifest["candidates"]) == {"int8-dynamic", "fp16", "fixed-seq128"}

    import sys

    sys.path.insert(0, str(RECIPES))
    from minilm_data import tokenize

    texts = ["A gripping, beautifully acted film.", "Tedious and far too long.", "It was fine, I guess."] * 4
    feed = tokenize({"text": texts})
    baseline = _embed(out / "baseline" / "model.onnx", feed)
    np.testing.assert_allclose(np.linalg.norm(baseline, axis=1), 1.0, atol=1e-5)  # unit embeddings

    def cosine(a, b):
        return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))

    assert cosine(_embed(out / "int8-dynamic" / "model.onnx", feed), baseline).min() > 0.97
    assert cosine(_embed(out / "fp16" / "model.onnx", feed), baseline).min() > 0.999
    fixed = onnx.load(str(out / "fixed-seq128" / "model.onnx"), load_external_data=False)
    for value in fixed.graph.input:
        assert [d.dim_value or d.dim_param for d in value.type.tensor_type.shape.dim] == ["batch", 128]
    np.testing.assert_allclose(_embed(out / "fixed-seq128" / "model.onnx", feed), baseline, atol=1e-5)

    int8_ops = {n.op_type for n in onnx.load(str(out / "int8-dynamic" / "model.onnx")).graph.node}
    assert {"DynamicQuantizeLinear", "MatMulInteger"} <= int8_ops
