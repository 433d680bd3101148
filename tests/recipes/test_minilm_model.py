"""The MiniLM factory must compute exactly what sentence-transformers computes, and export to
an ONNX model whose batch and sequence dims really are dynamic."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch

from recipes.minilm_data import tokenize
from recipes.minilm_model import build, model_dir

pytestmark = pytest.mark.slow  # model load, sentence-transformers load and an export: ~20 s on 2 cores

DATA = Path(__file__).resolve().parents[2] / "recipes" / "data"


@pytest.fixture(scope="module")
def texts() -> list[str]:
    with (DATA / "rt_polarity_test.csv").open(newline="", encoding="utf-8") as f:
        return [row["text"] for _, row in zip(range(16), csv.DictReader(f))]


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return build()


def _embed(model: torch.nn.Module, batch: dict[str, np.ndarray]) -> np.ndarray:
    with torch.no_grad():
        return model(torch.from_numpy(batch["input_ids"]), torch.from_numpy(batch["attention_mask"])).numpy()


def test_build_matches_sentence_transformers_encode(model: torch.nn.Module, texts: list[str]) -> None:
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(model_dir(), device="cpu").encode(texts, convert_to_numpy=True)
    ours = _embed(model, tokenize({"text": texts}))
    assert not model.training
    assert ours.dtype == np.float32 and ours.shape == (len(texts), 384)
    np.testing.assert_allclose(ours, reference, atol=1e-5, rtol=0)


def test_export_runs_in_onnxruntime_at_other_batch_and_seq(
    model: torch.nn.Module, texts: list[str], tmp_path: Path
) -> None:
    """Exported at [2, 128], run at [16, 128] and [5, 40]: a dim frozen by tracing would fail here."""
    batch = tokenize({"text": texts})
    path = tmp_path / "minilm.onnx"
    torch.onnx.export(
        model, (torch.from_numpy(batch["input_ids"][:2]), torch.from_numpy(batch["attention_mask"][:2])), str(path),
        input_names=["input_ids", "attention_mask"], output_names=["embedding"],
        dynamic_axes={"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"},
                      "embedding": {0: "batch"}},
        opset_version=17, dynamo=False,
    )
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    short = tokenize({"text": [t for t in texts if len(t) < 100][:5]})
    for feed in (batch, {name: array[:, :40] for name, array in short.items()}):
        assert feed["attention_mask"][:, -1].sum() < len(feed["attention_mask"])  # padding present
        (got,) = session.run(None, feed)
        np.testing.assert_allclose(got, _embed(model, feed), atol=1e-5, rtol=0)
