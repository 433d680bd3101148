"""One decoder LLM's ONNX session with its KV cache: the prefill and decode loop the quality gates, the speed
gates and (later) serving all run, so each measures the same path.

The graph is what ONNX Runtime GenAI's model builder writes (input_ids, attention_mask, past_key_values.N.key /
.value in; logits, present.N.key / .value out), described by the genai_config.json beside it. The decode path:
the whole prompt in one prefill call with an empty cache, then one token per call, each call's present tensors fed
back as the next call's past (numpy arrays through `InferenceSession.run`, no IO binding: the cache is copied
out and back once per token, which this module's timings include).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from temper.artifacts.core.errors import RecipeError

GENAI_CONFIG = "genai_config.json"


@dataclass(frozen=True)
class DecoderLayout:
    """Names and cache shape of a builder-made decoder, from its genai_config.json."""

    filename: str
    input_ids: str
    attention_mask: str
    past_key: str  # "past_key_values.%d.key"
    past_value: str
    logits: str
    present_key: str
    present_value: str
    layers: int
    kv_heads: int
    head_size: int
    eos: tuple[int, ...]
    vocab_size: int
    context_length: int

    @classmethod
    def read(cls, folder: Path) -> DecoderLayout:
        path = folder / GENAI_CONFIG
        try:
            model = json.loads(path.read_text())["model"]
            decoder = model["decoder"]
            ins, outs = decoder["inputs"], decoder["outputs"]
            eos = model["eos_token_id"]
            return cls(filename=decoder["filename"], input_ids=ins["input_ids"], attention_mask=ins["attention_mask"],
                       past_key=ins["past_key_names"], past_value=ins["past_value_names"], logits=outs["logits"],
                       present_key=outs["present_key_names"], present_value=outs["present_value_names"],
                       layers=int(decoder["num_hidden_layers"]), kv_heads=int(decoder["num_key_value_heads"]),
                       head_size=int(decoder["head_size"]), eos=tuple(eos if isinstance(eos, list) else [eos]),
                       vocab_size=int(model["vocab_size"]), context_length=int(model["context_length"]))
        except FileNotFoundError:
            raise RecipeError(str(path), "", "no genai_config.json: not a decoder folder the model builder wrote") \
                from None
        except (KeyError, TypeError, ValueError) as exc:
            raise RecipeError(str(path), "model.decoder", f"not a decoder configuration ({exc!r})") from None


@dataclass
class Generated:
    """A greedy generation: the new tokens and why it stopped."""

    tokens: list[int]
    stopped: str  # "eos", "length" or "loop"
    loop: tuple[int, int] | None = None  # (period, repeats) of the loop that stopped it


class DecoderSession:
    """An ONNX Runtime session over a decoder folder (model file + genai_config.json)."""

    def __init__(self, folder: Path, *, threads: int | None = None) -> None:
        import onnxruntime as ort

        self.folder = folder
        self.layout = DecoderLayout.read(folder)
        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
        options.log_severity_level = 3
        self.session = ort.InferenceSession(str(folder / self.layout.filename), options,
                                            providers=["CPUExecutionProvider"])
        self.dtype = np.float16 if "float16" in self.session.get_inputs()[2].type else np.float32
        lay = self.layout
        self._present = [name % i for i in range(lay.layers) for name in (lay.present_key, lay.present_value)]
        self._past = [name % i for i in range(lay.layers) for name in (lay.past_key, lay.past_value)]

    def empty_cache(self, batch: int = 1) -> list[np.ndarray]:
        shape = (batch, self.layout.kv_heads, 0, self.layout.head_size)
        return [np.zeros(shape, self.dtype) for _ in self._past]

    def forward(self, ids: np.ndarray, past: list[np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
        """One call: `ids` [batch, new tokens] after `past`; returns logits [batch, new, vocab] and the cache."""
        total = past[0].shape[2] + ids.shape[1]
        feeds = {self.layout.input_ids: ids.astype(np.int64),
                 self.layout.attention_mask: np.ones((ids.shape[0], total), np.int64),
                 **dict(zip(self._past, past))}
        logits, *present = self.session.run([self.layout.logits, *self._present], feeds)
        return logits.astype(np.float32, copy=False), present

    def logits(self, ids: Sequence[int]) -> np.ndarray:
        """Teacher-forced logits [tokens, vocab] of one sequence, in one prefill call."""
        out, _ = self.forward(np.asarray([ids], np.int64), self.empty_cache())
        return out[0]

    def generate(self, prompt: Sequence[int], max_new: int, *, loop_window: int = 8,
                 loop_repeats: int = 4) -> Generated:
        """Greedy decoding with the KV cache until an end-of-sequence token, `max_new` tokens, or a loop: the
        last `loop_repeats` spans of some period up to `loop_window` tokens all equal (a model stuck repeating)."""
        logits, past = self.forward(np.asarray([prompt], np.int64), self.empty_cache())
        tokens: list[int] = []
        for _ in range(max_new):
            token = int(np.argmax(logits[0, -1]))
            tokens.append(token)
            if token in self.layout.eos:
                return Generated(tokens, "eos")
            found = repetition(tokens, loop_window, loop_repeats)
            if found is not None:
                return Generated(tokens, "loop", found)
            logits, past = self.forward(np.asarray([[token]], np.int64), past)
        return Generated(tokens, "length")

    def time_prefill(self, prompt: np.ndarray) -> float:
        """Seconds to the first token: the prefill call on `prompt` [batch, tokens] and the argmax."""
        begin = time.perf_counter()
        logits, _ = self.forward(prompt, self.empty_cache(prompt.shape[0]))
        np.argmax(logits[:, -1], axis=-1)
        return time.perf_counter() - begin

    def time_decode(self, prompt: np.ndarray, steps: int) -> float:
        """Seconds for `steps` greedy decode calls after a prefill of `prompt` (not timed), the cache growing."""
        logits, past = self.forward(prompt, self.empty_cache(prompt.shape[0]))
        begin = time.perf_counter()
        for _ in range(steps):
            token = np.argmax(logits[:, -1], axis=-1).reshape(-1, 1)
            logits, past = self.forward(token, past)
        return time.perf_counter() - begin


def repetition(tokens: Sequence[int], window: int, repeats: int) -> tuple[int, int] | None:
    """(period, repeats) when the tail of `tokens` is one span of `period` <= window tokens `repeats` times over."""
    for period in range(1, window + 1):
        span = period * repeats
        if len(tokens) < span:
            break
        tail = list(tokens[-span:])
        if all(tail[i] == tail[i % period] for i in range(span)):
            return period, repeats
    return None
