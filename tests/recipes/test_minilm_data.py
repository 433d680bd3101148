"""The MiniLM recipe's preprocess: fixed 128-token layout, int64, masks that match the text."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from recipes.minilm_data import MAX_LENGTH, _tokenizer, tokenize

DATA = Path(__file__).resolve().parents[2] / "recipes" / "data"


def _texts(n: int) -> list[str]:
    with (DATA / "rt_polarity_test.csv").open(newline="", encoding="utf-8") as f:
        return [row["text"] for _, row in zip(range(n), csv.DictReader(f))]


def test_tokenize_pads_every_batch_to_128_int64() -> None:
    texts = _texts(16)
    out = tokenize({"text": texts, "label": [0] * len(texts)})
    assert sorted(out) == ["attention_mask", "input_ids"]
    for array in out.values():
        assert array.shape == (16, MAX_LENGTH) and array.dtype == np.int64


def test_mask_counts_real_tokens_and_padding_is_zero() -> None:
    texts = _texts(16) + ["word " * 300]  # the last one must be truncated, not overflow
    out = tokenize({"text": texts})
    ids, mask = out["input_ids"], out["attention_mask"]
    real = [min(len(_tokenizer()(t)["input_ids"]), MAX_LENGTH) for t in texts]
    assert mask.sum(axis=1).tolist() == real
    assert np.all(mask == (np.arange(MAX_LENGTH) < np.array(real)[:, None]))  # right-padded, no holes
    assert np.all(ids[mask == 0] == _tokenizer().pad_token_id)
    assert real[-1] == MAX_LENGTH and mask[-1].all()


def test_subsets_are_balanced_and_disjoint() -> None:
    """The calibration/probe-training set and the evaluation set must never share a sentence."""
    rows = {}
    for split in ("train", "test"):
        with (DATA / f"rt_polarity_{split}.csv").open(newline="", encoding="utf-8") as f:
            rows[split] = list(csv.DictReader(f))
    assert [len(rows["train"]), len(rows["test"])] == [2000, 1000]
    for split_rows in rows.values():
        labels = [r["label"] for r in split_rows]
        assert labels.count("0") == labels.count("1")
    assert not {r["text"] for r in rows["train"]} & {r["text"] for r in rows["test"]}
