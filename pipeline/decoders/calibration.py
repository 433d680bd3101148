"""Calibration feeds for a data-aware weight quantizer (NNCF's AWQ and scale estimation, ONNX Runtime's GPTQ):
one prefill call per held-out token window, an empty KV cache, fed the way the decoder session feeds the graph,
so the activations a quantizer sees are those the gates and serving run."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np


def prefill_feeds(folder: Path, windows: Sequence[Sequence[int]]) -> list[dict[str, np.ndarray]]:
    """One prefill call's inputs per window: its ids, a mask of ones, position ids where the graph takes them, and
    every past key/value empty (sequence length 0)."""
    from temper.artifacts.engines.decoder_session import DecoderSession

    session = DecoderSession(folder)
    layout = session.layout
    names = [i.name for i in session.session.get_inputs()]
    positions = "position_ids" if "position_ids" in names else None
    past = [n for n in names if n not in (layout.input_ids, layout.attention_mask, positions)]
    feeds = []
    for window in windows:
        ids = np.asarray([window], np.int64)
        feed = {layout.input_ids: ids, layout.attention_mask: np.ones_like(ids),
                **dict(zip(past, session.empty_cache(), strict=True))}
        if positions:
            feed[positions] = np.arange(ids.shape[1], dtype=np.int64)[None]
        feeds.append(feed)
    return feeds
