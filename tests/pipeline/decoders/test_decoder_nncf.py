"""NNCF's compress_weights as a decoder weight backend, on a tiny random Llama: what it stores (4-bit groups as
blocked DequantizeLinear, its INT8 backup for the last MatMul and for `ratio` < 1), that the census counts it,
that `temper run` gates it (AWQ and scale estimation calibrating on windows the gates do not see)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

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

SCHEMA = json.loads((Path(__file__).resolve().parents[3] / "validators" / "decoder_report.schema.json").read_text())


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tiny")
    loaded = load_decoder(write_recipe(root / "recipe.yaml", tiny_llama(root / "hf")))
    return build.baseline(loaded, root / "cache")


@pytest.mark.parametrize(("options", "census"), [
    ({"group_size": 32}, {"4-bit": 10, "8-bit": 1, "float": 0}),  # NNCF keeps the last MatMul (lm_head) 8-bit
    ({"group_size": 32, "all_layers": True}, {"4-bit": 11, "8-bit": 0, "float": 0}),
    ({"group_size": 32, "ratio": 0.5}, {"4-bit": 4, "8-bit": 7, "float": 0}),
    ({"mode": "int4_asym", "group_size": 64, "all_layers": True, "keep_float": ["lm_head"]},
     {"4-bit": 10, "8-bit": 0, "float": 1}),
    ({"mode": "int8_asym"}, {"4-bit": 0, "8-bit": 11, "float": 0}),
])
def test_nncf_stores_the_weights_the_census_counts(baseline: Path, tmp_path: Path, options: dict[str, object],
                                                   census: dict[str, int]) -> None:
    weights = WeightOptions.model_validate({"method": "nncf", **options})
    folder, kept = build.candidate(baseline, weights, tmp_path / "c")
    assert kept == (["/lm_head/MatMul"] if "keep_float" in options else [])
    assert weight_census(folder / "model.onnx") == census
    model = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    assert [t for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    blocks = {a.i for n in model.graph.node if n.op_type == "DequantizeLinear" for a in n.attribute
              if a.name == "block_size"}
    assert blocks == ({options["group_size"]} if "group_size" in options else set())
    embedding = [n for n in model.graph.node if n.op_type == "DequantizeLinear" and "embed_tokens" in n.name]
    assert embedding == []  # left out: NNCF's 4-bit one cannot run, and a tied one fails
    assert (folder / "genai_config.json").is_file() and (folder / "tokenizer.json").is_file()
    assert (folder / "model.onnx.data").stat().st_size < (baseline / "model.onnx.data").stat().st_size
    quality = compare([[1, *range(40, 71)]] * 3, DecoderSession(baseline).logits, DecoderSession(folder).logits, 0.95)
    assert 0 < quality.kl < 0.05 and quality.agreement > 0.5


def test_a_group_that_does_not_divide_the_channels_is_nncfs_error(baseline: Path, tmp_path: Path) -> None:
    """The tiny model's 64 channels take no group of 128: NNCF refuses, which `temper run` reports as not built."""
    with pytest.raises(Exception, match="group size value 128"):
        build.candidate(baseline, WeightOptions.model_validate({"method": "nncf"}), tmp_path / "c")


def test_temper_run_gates_nncf_candidates_calibrated_on_held_out_text(temper: Callable[..., CliResult],
                                                                      tmp_path: Path, baseline: Path) -> None:
    import jsonschema

    recipe = write_recipe(tmp_path / "recipe.yaml", tmp_path, model={"onnx": str(baseline)}, candidates={
        "n4": {"weights": {"method": "nncf", "mode": ["int4_sym", "int4_asym"], "group_size": 32, "awq": True,
                           "scale_estimation": True}},
        "mixed": {"weights": {"method": "nncf", "group_size": 32, "ratio": 0.5}},
        "wide": {"weights": {"method": "nncf"}}},
        validate={"quality": {"nll_delta_max": 1.0, "agreement_min": 0.1, "kl_max": 1.0, "generation_tokens": 8},
                  "speed": {"prompt_length": 16, "decode_tokens": 4, "rounds": 2}})
    result = temper("run", str(recipe), "--output", str(tmp_path / "out"), "--allow-build-errors")
    assert result.code == 0, result.stdout + result.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    jsonschema.validate(report, SCHEMA)
    assert report["searches"] == {"n4": ["n4-int4_sym", "n4-int4_asym"]}
    assert "group size value 128" in report["not_built"]["wide"]
    for name in ("n4-int4_sym", "n4-int4_asym", "mixed"):
        model = report["candidates"][name]
        precision = next(g for g in model["gates"] if g["name"] == "precision")
        assert precision["passed"] and "8-bit (NNCF's backup)" in precision["detail"], precision
        assert model["census"]["4-bit"] >= 4 and model["census"]["float"] == 0
        assert {g["name"] for g in model["gates"]} == {"precision", "nll_delta", "agreement", "kl", "generation"}
    assert report["candidates"]["n4-int4_asym"]["weights"]["awq"] is True


def test_too_little_text_to_calibrate_on_is_bad_input(temper: Callable[..., CliResult], tmp_path: Path,
                                                      baseline: Path) -> None:
    recipe = write_recipe(tmp_path / "recipe.yaml", tmp_path, model={"onnx": str(baseline)},
                          data={"file": str(Path(__file__).parents[3] / "recipes" / "data" / "rt_polarity_test.csv"),
                                "column": "text", "sequences": 6, "sequence_length": 32,
                                "calibration_sequences": 100_000},
                          candidates={"n": {"weights": {"method": "nncf", "group_size": 32, "awq": True}}})
    result = temper("run", str(recipe), "--output", str(tmp_path / "out"))
    assert result.code == 2 and "data.calibration_sequences" in result.stderr, result.stderr
    assert "after the 6 gated ones, not 100000" in result.stderr.replace("\n", "")


def test_awq_and_scale_estimation_use_the_calibration_windows(baseline: Path, tmp_path: Path) -> None:
    options = {"method": "nncf", "mode": "int4_asym", "group_size": 32, "all_layers": True}
    plain, _ = build.candidate(baseline, WeightOptions.model_validate(options), tmp_path / "plain")
    windows = [[1, *range(10 + i, 41 + i)] for i in range(4)]
    tuned, _ = build.candidate(baseline, WeightOptions.model_validate(
        {**options, "awq": True, "scale_estimation": True}), tmp_path / "tuned", windows)
    assert weight_census(tuned / "model.onnx") == {"4-bit": 11, "8-bit": 0, "float": 0}
    assert (tuned / "model.onnx.data").read_bytes() != (plain / "model.onnx.data").read_bytes()
    other, _ = build.candidate(baseline, WeightOptions.model_validate(
        {**options, "awq": True, "scale_estimation": True}), tmp_path / "other", [w[::-1] for w in windows])
    assert (other / "model.onnx.data").read_bytes() != (tuned / "model.onnx.data").read_bytes()
