"""A tiny random Llama through ONNX Runtime GenAI's builder and temper's weight candidates: the graph has its KV
cache and external data, the cache gives what one call gives, each candidate's weights are what it asked."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest

from temper.artifacts.engines.decoder_session import DecoderSession
from temper.pipeline.decoders import build
from temper.pipeline.decoders.loading import load_decoder
from temper.pipeline.decoders.spec import WeightOptions
from temper.validators.decoder_census import weight_census
from temper.validators.perplexity import compare
from tests.helpers import CliResult
from tests.pipeline.decoders.tiny import tiny_llama, write_recipe


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tiny")
    loaded = load_decoder(write_recipe(root / "recipe.yaml", tiny_llama(root / "hf")))
    return build.baseline(loaded, root / "cache")


def test_the_builder_writes_a_kv_cache_graph_with_external_data(baseline: Path) -> None:
    session = DecoderSession(baseline)
    names = {i.name for i in session.session.get_inputs()}
    assert {"input_ids", "attention_mask", "past_key_values.0.key", "past_key_values.1.value"} <= names
    model = onnx.load(str(baseline / "model.onnx"), load_external_data=False)
    external = [t for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    assert external and (baseline / "model.onnx.data").stat().st_size > 100_000
    assert weight_census(baseline / "model.onnx") == {"4-bit": 0, "8-bit": 0, "float": 11}


def test_the_cache_gives_what_one_call_gives(baseline: Path) -> None:
    session = DecoderSession(baseline)
    ids = [1, 40, 41, 42, 90, 7, 200, 13]
    whole = session.logits(ids)
    first, past = session.forward(np.asarray([ids[:5]]), session.empty_cache())
    rest, past = session.forward(np.asarray([ids[5:]]), past)
    assert past[0].shape[2] == len(ids)
    np.testing.assert_allclose(rest[0], whole[5:], atol=1e-4)
    generated = session.generate(ids, 6, loop_repeats=50)
    assert generated.stopped == "length" and len(generated.tokens) == 6


@pytest.mark.parametrize(("options", "label"), [
    ({"method": "int8-dynamic"}, "8-bit"),
    ({"method": "matmul-nbits", "block_size": 32}, "4-bit"),
    ({"method": "matmul-nbits", "algorithm": "hqq", "block_size": 32}, "4-bit"),
    ({"method": "matmul-nbits", "bits": 8, "block_size": 64, "accuracy_level": 0}, "8-bit"),
])
def test_each_candidate_stores_every_weight_as_asked(baseline: Path, tmp_path: Path, options: dict[str, object],
                                                     label: str) -> None:
    weights = WeightOptions.model_validate(options)
    folder, kept = build.candidate(baseline, weights, tmp_path / "c")
    assert kept == []
    census = weight_census(folder / "model.onnx")
    assert census[label] == 11 and sum(census.values()) == 11
    nodes = onnx.load(str(folder / "model.onnx"), load_external_data=False).graph.node
    levels = {a.i for n in nodes if n.op_type == "MatMulNBits" for a in n.attribute if a.name == "accuracy_level"}
    blocks = {a.i for n in nodes if n.op_type == "MatMulNBits" for a in n.attribute if a.name == "block_size"}
    if weights.method == "matmul-nbits":
        assert levels == ({weights.accuracy_level} if weights.accuracy_level else set())
        assert blocks == {weights.block_size}
    assert (folder / "genai_config.json").is_file() and (folder / "tokenizer.json").is_file()
    quality = compare([[1, *range(40, 71)]] * 3, DecoderSession(baseline).logits, DecoderSession(folder).logits, 0.95)
    assert 0 < quality.kl < 0.05 and quality.agreement > 0.5


@pytest.mark.parametrize("method", ["int8-dynamic", "matmul-nbits"])
def test_keep_float_leaves_the_named_weights_in_float(baseline: Path, tmp_path: Path, method: str) -> None:
    weights = WeightOptions.model_validate({"method": method, "keep_float": ["lm_head"]})
    folder, kept = build.candidate(baseline, weights, tmp_path / "c")
    assert kept == ["/lm_head/MatMul"]
    assert weight_census(folder / "model.onnx") == {"4-bit": 10 if method == "matmul-nbits" else 0,
                                                     "8-bit": 10 if method == "int8-dynamic" else 0, "float": 1}


def test_a_model_against_itself_is_exactly_equal(baseline: Path) -> None:
    session = DecoderSession(baseline)
    quality = compare([list(range(3, 35)), list(range(100, 132))], session.logits, session.logits, 0.95)
    assert quality.delta.mean == 0 and quality.delta.high == 0 and quality.agreement == 1 and quality.kl == 0
    assert quality.tokens == 62 and quality.baseline_perplexity == quality.candidate_perplexity > 1


def test_text_too_short_for_the_asked_sequences_is_bad_input(baseline: Path, tmp_path: Path) -> None:
    from temper.artifacts.core.errors import RecipeError
    from temper.pipeline.decoders.text import text_set

    short = tmp_path / "short.txt"
    short.write_text("a few words\nand a second line\n")
    recipe = write_recipe(tmp_path / "recipe.yaml", tmp_path, model={"onnx": str(baseline)},
                          data={"file": str(short), "sequences": 4, "sequence_length": 16})
    loaded = load_decoder(recipe)
    with pytest.raises(RecipeError) as caught:
        text_set(loaded, baseline)
    assert caught.value.key == "data.sequences" and "1 sequences of 16, not 4" in caught.value.message
    enough = text_set(load_decoder(write_recipe(recipe, tmp_path, model={"onnx": str(baseline)},
                                                data={"file": str(short), "sequences": 1, "sequence_length": 16,
                                                      "prompts": 2, "prompt_tokens": 5})), baseline)
    assert [len(s) for s in enough.sequences] == [16] and [len(p) for p in enough.prompts] == [5, 5]


def test_a_prompt_longer_than_the_context_is_bad_input(temper: Callable[..., CliResult], baseline: Path,
                                                       tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path / "recipe.yaml", tmp_path, model={"onnx": str(baseline)},
                          validate={"speed": {"prompt_length": 250, "decode_tokens": 32}})
    result = temper("run", str(recipe), "--output", str(tmp_path / "out"))
    assert result.code == 2 and "validate.speed.prompt_length: 282 tokens" in result.stderr.replace("\n", "")
    assert "context of 256" in result.stderr.replace("\n", "") and not (tmp_path / "out").exists()
