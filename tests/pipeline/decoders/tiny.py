"""Tiny random decoders for structure tests in seconds: a transformers Llama of 2 layers, hidden 64, with a
byte-level tokenizer (259 tokens) so ONNX Runtime GenAI's builder, which copies the tokenizer, accepts it."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.helpers import REPO

TEXT = REPO / "recipes" / "data" / "rt_polarity_test.csv"


def tiny_llama(folder: Path, seed: int = 0) -> Path:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for char in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[char] = len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(vocab), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, bos_token_id=1,
                         eos_token_id=2, tie_word_embeddings=False)
    LlamaForCausalLM(config).save_pretrained(folder)
    fast.save_pretrained(folder)
    return folder


def write_recipe(path: Path, hf: Path, **changes: object) -> Path:
    """A decoder recipe over `hf` and the repository's movie-review text; `changes` replace top-level keys."""
    recipe: dict[str, object] = {
        "version": 1, "kind": "decoder", "name": "tiny", "model": {"hf": str(hf)},
        "data": {"file": str(TEXT), "column": "text", "sequences": 6, "sequence_length": 32, "prompts": 2},
        "candidates": {
            "int8": {"weights": {"method": "int8-dynamic"}},
            "q4": {"weights": {"method": "matmul-nbits", "algorithm": ["rtn", "hqq"], "block_size": 32}},
        },
        "validate": {"quality": {"nll_delta_max": 0.05, "agreement_min": 0.5, "kl_max": 0.01,
                                 "generation_tokens": 8},
                     "speed": {"prompt_length": 16, "decode_tokens": 4, "rounds": 2}},
        "select": {"workload": "decode"},
    }
    recipe.update(changes)
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path
