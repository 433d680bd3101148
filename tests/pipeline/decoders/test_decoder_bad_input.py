"""Bad decoder recipes: one line naming the file and the key, exit 2, before anything is built."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers import CliResult
from tests.pipeline.decoders.tiny import TEXT, write_recipe


@pytest.fixture
def hf(tmp_path: Path) -> Path:
    """A folder that looks like a transformers model to the loader (nothing in these tests reaches the builder)."""
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    return folder


def _one_line(result: CliResult, recipe: Path, key: str, words: str) -> None:
    assert result.code == 2, result.stdout + result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert str(recipe) in lines[0].replace("\n", "") and f": {key}: " in lines[0] and words in lines[0], lines[0]


@pytest.mark.parametrize(("changes", "key", "words"), [
    ({"model": {"hf": "nowhere"}}, "model.hf", "no folder"),
    ({"model": {"hf": "x", "gguf": "y.gguf"}}, "model", "exactly one of"),
    ({"model": {"gguf": "missing.gguf"}}, "model.gguf", "no file"),
    ({"data": {"file": "missing.txt"}}, "data.file", "no file"),
    ({"data": {"file": str(TEXT), "column": "body"}}, "data.column", "no column 'body'"),
    ({"data": {"file": str(TEXT)}}, "data", "data.column names the text column"),
    ({"candidates": {"int8": {"weights": {"method": "int8-dynamic", "bits": 4}}}}, "candidates.int8.weights",
     "'bits' applies to method matmul-nbits only"),
    ({"candidates": {"q": {"weights": {"method": "matmul-nbits", "bits": 3}}}}, "candidates.q.weights.bits", "4 or 8"),
    ({"candidates": {"q": {"weights": {"method": "matmul-nbits", "block_size": [32, 48]}}}},
     "candidates.q-b48.weights.block_size", "16, 32, 64, 128 or 256"),
    ({"candidates": {"q": {"weights": {"method": "matmul-nbits", "algorithm": "gptq", "symmetric": True}}}},
     "candidates.q.weights", "'symmetric' applies to algorithm rtn only (gptq stores a zero point per block)"),
    ({"candidates": {"q": {"weights": {"method": "matmul-nbits", "algorithm": "gptq", "bits": [4, 8]}}}},
     "candidates.q-8bit.weights", "algorithm gptq stores 4-bit weights only"),
    ({"candidates": {"q": {"weights": {"method": "matmul-nbits", "algorithm": "awq"}}}},
     "candidates.q.weights.algorithm", "'rtn', 'hqq', 'k_quant' or 'gptq'"),
    ({"candidates": {"n": {"weights": {"method": "nncf", "bits": 8}}}}, "candidates.n.weights",
     "'bits' applies to method matmul-nbits only"),
    ({"candidates": {"q": {"weights": {"method": "matmul-nbits", "ratio": 0.5}}}}, "candidates.q.weights",
     "'ratio' applies to method nncf only"),
    ({"candidates": {"n": {"weights": {"method": "nncf", "mode": "int8_asym", "awq": True}}}}, "candidates.n.weights",
     "'awq' applies to nncf's int4 modes only"),
    ({"candidates": {"n": {"weights": {"method": "nncf", "ratio": 0}}}}, "candidates.n.weights.ratio",
     "greater than 0"),
    ({"candidates": {"n": {"weights": {"method": "nncf", "mode": "nf4"}}}}, "candidates.n.weights.mode", "'int4_sym'"),
    ({"candidates": {"n": {"weights": {"method": "nncf", "group_size": [32, 48]}}}},
     "candidates.n-g48.weights.group_size", "-1, 16, 32"),
    ({"candidates": {"baseline": {"weights": {"method": "int8-dynamic"}}}}, "", "'baseline' is reserved"),
    ({"validate": {"quality": {"agreement_min": 1.5}}}, "validate.quality.agreement_min", "less than or equal"),
    ({"select": {"workload": "chat"}}, "select.workload", "'decode' or 'prefill'"),
])
def test_a_bad_decoder_recipe_is_one_line_naming_its_key(temper: Callable[..., CliResult], tmp_path: Path, hf: Path,
                                                          changes: dict[str, object], key: str, words: str) -> None:
    recipe = write_recipe(tmp_path / "recipe.yaml", hf, **changes)
    result = temper("run", str(recipe), "--output", str(tmp_path / "out"))
    if key:
        _one_line(result, recipe, key, words)
    else:
        assert result.code == 2 and words in result.stderr and str(recipe) in result.stderr.replace("\n", "")
    assert not (tmp_path / "out").exists()


def test_a_key_given_twice_is_named_with_its_line(temper: Callable[..., CliResult], tmp_path: Path, hf: Path) -> None:
    recipe = write_recipe(tmp_path / "recipe.yaml", hf)
    recipe.write_text(recipe.read_text() + "name: again\n")
    result = temper("run", str(recipe), "--output", str(tmp_path / "out"))
    assert result.code == 2 and "duplicate key 'name'" in result.stderr and "line " in result.stderr


def test_commands_other_than_run_refuse_a_decoder_recipe_in_one_line(temper: Callable[..., CliResult],
                                                                      tmp_path: Path, hf: Path) -> None:
    recipe = write_recipe(tmp_path / "recipe.yaml", hf)
    result = temper("check", str(recipe))
    _one_line(result, recipe, "kind", "only `temper run` takes it so far")


def test_an_output_folder_temper_did_not_write_is_refused_and_left_alone(temper: Callable[..., CliResult],
                                                                        tmp_path: Path, hf: Path) -> None:
    """A folder of the user's, even one holding a report.json, is never replaced: one line, exit 2, before any
    build, and every file in it as it was."""
    recipe = write_recipe(tmp_path / "recipe.yaml", hf)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "report.json").write_text('{"mine": true}')
    (mine / "notes.txt").write_text("keep")
    result = temper("run", str(recipe), "--output", str(mine))
    _one_line(result, recipe, "--output", "a folder temper did not write")
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt", "report.json"]
    assert (mine / "report.json").read_text() == '{"mine": true}'
    assert [p.name for p in tmp_path.iterdir() if ".partial" in p.name] == []
