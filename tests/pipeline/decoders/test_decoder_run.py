"""`temper run` on a tiny random Llama, end to end: builder, INT8 dynamic and searched 4-bit candidates, the
quality and generation gates, the paired speed rounds, report.json against its schema, the exit code."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import jsonschema
import pytest

from tests.helpers import CliResult
from tests.pipeline.decoders.tiny import tiny_llama, write_recipe

SCHEMA = json.loads((Path(__file__).resolve().parents[3] / "validators" / "decoder_report.schema.json").read_text())
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def hf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_llama(tmp_path_factory.mktemp("tiny") / "hf")


def test_a_decoder_recipe_builds_gates_and_selects(temper: Callable[..., CliResult], tmp_path: Path, hf: Path) -> None:
    recipe = write_recipe(tmp_path / "recipe.yaml", hf, candidates={
        "int8": {"weights": {"method": "int8-dynamic", "keep_float": ["lm_head"]}},
        "q4": {"weights": {"method": "matmul-nbits", "algorithm": ["rtn", "hqq"], "block_size": 32}}})
    result = temper("run", str(recipe), "--output", str(tmp_path / "out"))
    assert result.code == 0, result.stdout + result.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    jsonschema.validate(report, SCHEMA)
    assert report["kind"] == "decoder" and set(report["candidates"]) == {"int8", "q4-rtn", "q4-hqq"}
    assert report["searches"] == {"q4": ["q4-rtn", "q4-hqq"]}
    assert report["candidates"]["int8"]["census"] == {"4-bit": 0, "8-bit": 10, "float": 1}  # lm_head kept
    precision = next(g for g in report["candidates"]["int8"]["gates"] if g["name"] == "precision")
    assert precision["passed"] and precision["budget"] == 10 / 11
    assert report["candidates"]["q4-hqq"]["census"] == {"4-bit": 11, "8-bit": 0, "float": 0}
    assert report["baseline"]["census"] == {"4-bit": 0, "8-bit": 0, "float": 11}
    for name, model in report["candidates"].items():
        assert {g["name"] for g in model["gates"]} == {"precision", "nll_delta", "agreement", "kl", "generation"}
        low, high = model["quality"]["nll_delta_interval"]
        assert low <= model["quality"]["nll_delta"] <= high and model["quality"]["sequences"] == 6
        assert (model["speed"] is not None) == model["passed"], name
        if model["speed"]:
            assert model["speed"]["decode_speedup_interval"] and model["speed"]["ttft_speedup_interval"]
        assert (tmp_path / "out" / name / "model.onnx").is_file()
    assert f"selected: {report['selected']} — " in result.stdout
    assert "no IO binding" in report["speed_setup"]["decode_path"]
    export = report["export"]
    assert export["passed"] and export["agreement"] == 1.0 and abs(export["nll_delta"]) < 1e-4
    assert [g["name"] for g in report["baseline"]["gates"]] == ["export.nll_delta", "export.agreement"]
    assert "baseline vs transformers: perplexity" in result.stdout
    assert report["passed"] == (report["selected"] != "baseline")


def test_budgets_no_candidate_can_hold_select_the_baseline_and_a_required_one_fails_the_job(
        temper: Callable[..., CliResult], tmp_path: Path, hf: Path) -> None:
    recipe = write_recipe(tmp_path / "recipe.yaml", hf, candidates={"int8": {"weights": {"method": "int8-dynamic"}}},
                          validate={"quality": {"nll_delta_max": 0.0, "agreement_min": 1.0, "kl_max": 0.0,
                                                "generation_tokens": 4},
                                    "speed": {"prompt_length": 8, "decode_tokens": 2, "rounds": 2}})
    result = temper("run", str(recipe), "--output", str(tmp_path / "out"), "--require", "int8")
    assert result.code == 1, result.stdout + result.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    failed = {g["name"] for g in report["candidates"]["int8"]["gates"] if not g["passed"]}
    assert {"agreement", "kl"} <= failed and report["candidates"]["int8"]["speed"] is None
    assert report["selected"] == "baseline" and not report["passed"]
    assert "int8: failed" in report["selection_reason"] and "--require int8: did not pass" in result.stderr


def test_a_baseline_that_no_longer_matches_its_source_fails_the_job(temper: Callable[..., CliResult], tmp_path: Path,
                                                                   hf: Path, isolated_cache: Path) -> None:
    """The builder's output, cached, then changed the way a faulty exporter would (the LM head's weights scaled):
    the baseline's gates against transformers catch it and the job exits 1, whatever the candidates did."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    recipe = write_recipe(tmp_path / "recipe.yaml", hf, candidates={"int8": {"weights": {"method": "int8-dynamic"}}},
                          validate={"quality": {"generation_tokens": 4, "agreement_min": 0.5},
                                    "speed": {"prompt_length": 8, "decode_tokens": 2, "rounds": 2}})
    assert temper("run", str(recipe), "--output", str(tmp_path / "first")).code == 0
    (cached,) = (isolated_cache / "decoders").glob("*/model.onnx")
    model = onnx.load(str(cached))
    head = next(t for t in model.graph.initializer if t.name.startswith("lm_head"))
    head.CopyFrom(numpy_helper.from_array((numpy_helper.to_array(head) * 1.5).astype(np.float32), head.name))
    (cached.parent / "model.onnx.data").unlink()
    onnx.save_model(model, str(cached), save_as_external_data=True, location="model.onnx.data")
    result = temper("run", str(recipe), "--output", str(tmp_path / "second"))
    assert result.code == 1, result.stdout + result.stderr
    report = json.loads((tmp_path / "second" / "report.json").read_text())
    assert not report["export"]["passed"] and not report["baseline"]["passed"]
    assert "export.nll_delta" in {g["name"] for g in report["baseline"]["gates"] if not g["passed"]}
    assert "baseline vs transformers" in result.stdout and "FAIL: export.nll_delta" in result.stdout
