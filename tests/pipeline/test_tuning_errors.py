"""Bad input to the tuning features (option searches, presets, accuracy-aware fallback, sensitivity):
one line on stderr naming the file, the key path and what is wrong, exit code 2, no output folder."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import edit_recipe

STATIC = "candidates.int8-static.steps[0].quantize"
DYNAMIC = "candidates.int8-dynamic.steps[0].quantize"


@pytest.fixture
def recipe(digits_dir: Path) -> Path:
    return digits_dir / "digits-cnn.yaml"


def _edit(recipe: Path, change: Callable[[dict[str, Any]], Any]) -> Path:
    edit_recipe(recipe, change)
    return recipe


def _static(data: dict[str, Any]) -> dict[str, Any]:
    return data["candidates"]["int8-static"]["steps"][0]["quantize"]


def _dynamic(data: dict[str, Any]) -> dict[str, Any]:
    return data["candidates"]["int8-dynamic"]["steps"][0]["quantize"]


def _assert_bad_input(result, recipe: Path, key: str, *fragments: str, out: Path | None = None) -> None:
    """Exit 2, one non-empty line on stderr: `error: FILE: KEY: message` with every fragment in it."""
    assert result.code == 2, (result.code, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    line = lines[0]
    assert "Traceback" not in result.stderr, result.stderr
    assert recipe.name in line, line
    assert line.startswith(f"error: {recipe}: {key}: "), line
    for fragment in fragments:
        assert fragment in line, line
    if out is not None:
        assert not out.exists(), "a refused run must not leave an output folder"
        assert not list(out.parent.glob(f".{out.name}.partial-*")), "staging folder left behind"


# 1. fallback needs an accuracy budget to aim at


def test_fallback_without_accuracy_gate(temper, recipe):
    def change(d: dict[str, Any]) -> None:
        del d["validate"]["accuracy"]
        _static(d)["fallback"] = {"max_trials": 4}

    _edit(recipe, change)
    _assert_bad_input(temper("check", recipe), recipe, f"{STATIC}.fallback", "validate.accuracy")


def test_fallback_without_validate_section_run_leaves_no_output(temper, recipe, tmp_path):
    def change(d: dict[str, Any]) -> None:
        del d["validate"]
        del d["publish"]  # publish requires a validate section
        _static(d)["fallback"] = {"max_trials": 4}

    _edit(recipe, change)
    out = tmp_path / "out"
    _assert_bad_input(temper("run", recipe, "-o", out), recipe, f"{STATIC}.fallback", "validate.accuracy", out=out)


# 2. fallback's own options


def test_fallback_zero_trials(temper, recipe):
    _edit(recipe, lambda d: _static(d).update(fallback={"max_trials": 0}))
    _assert_bad_input(temper("check", recipe), recipe, f"{STATIC}.fallback.max_trials", "greater than 0")


# 3. a candidate's max_trials


def test_candidate_max_trials_zero(temper, recipe):
    def change(d: dict[str, Any]) -> None:
        d["candidates"]["int8-static"]["max_trials"] = 0
        _static(d)["format"] = ["qdq", "qoperator"]

    _edit(recipe, change)
    _assert_bad_input(temper("check", recipe), recipe, "candidates.int8-static.max_trials", "at least 1")


def test_candidate_max_trials_without_alternatives(temper, recipe):
    _edit(recipe, lambda d: d["candidates"]["int8-static"].update(max_trials=3))
    _assert_bad_input(temper("check", recipe), recipe, "candidates.int8-static.max_trials", "lists alternatives")


# 4. an empty list of alternatives


def test_empty_alternatives(temper, recipe):
    _edit(recipe, lambda d: _static(d).update(format=[]))
    _assert_bad_input(temper("check", recipe), recipe, f"{STATIC}.format", "empty list")


# 5. an unknown value among the alternatives names its place in the list


def test_unknown_format_alternative_run_leaves_no_output(temper, recipe, tmp_path):
    _edit(recipe, lambda d: _static(d).update(format=["qdq", "qlinear"]))
    out = tmp_path / "out"
    _assert_bad_input(temper("run", recipe, "-o", out), recipe, f"{STATIC}.format[1]",
                      "'qlinear'", "qdq", "qoperator", out=out)


def test_unknown_calibration_alternative(temper, recipe):
    _edit(recipe, lambda d: _static(d).update(calibration=["minmax", "kl"]))
    _assert_bad_input(temper("check", recipe), recipe, f"{STATIC}.calibration[1]",
                      "'kl'", "minmax", "entropy", "percentile")


# 6. presets


def test_unknown_preset_lists_presets(temper, recipe):
    _edit(recipe, lambda d: _static(d).update(preset="avx3"))
    _assert_bad_input(temper("check", recipe), recipe, f"{STATIC}.preset",
                      "'avx3'", "avx512_vnni", "avx2", "arm64", "tensorrt")


def test_unknown_target_lists_targets(temper, recipe):
    _edit(recipe, lambda d: d.update(target="avx3"))
    _assert_bad_input(temper("check", recipe), recipe, "target", "'avx3'", "host", "avx512_vnni", "avx2", "arm64")


def test_auto_preset_for_a_tensorrt_target_needs_static_mode(temper, recipe):
    _edit(recipe, lambda d: d.update(target="tensorrt"))
    _assert_bad_input(temper("check", recipe), recipe, DYNAMIC, "preset auto resolves to tensorrt", "mode: static")


def test_unknown_preset_alternative(temper, recipe):
    _edit(recipe, lambda d: _static(d).update(preset=["avx2", "nope"]))
    _assert_bad_input(temper("check", recipe), recipe, f"{STATIC}.preset[1]", "'nope'", "avx512_vnni", "tensorrt")


# 7. the tensorrt preset writes Q/DQ graphs


def test_tensorrt_preset_needs_static(temper, recipe):
    _edit(recipe, lambda d: _dynamic(d).update(preset="tensorrt"))
    _assert_bad_input(temper("check", recipe), recipe, DYNAMIC, "tensorrt", "mode: static")


# 8. fallback is for static quantization


def test_fallback_with_dynamic_mode(temper, recipe):
    _edit(recipe, lambda d: _dynamic(d).update(fallback={"max_trials": 4}))
    _assert_bad_input(temper("check", recipe), recipe, DYNAMIC, "'fallback'", "only for mode: static")


# 9. temper sensitivity --candidate


def test_sensitivity_unknown_candidate(temper, recipe):
    _assert_bad_input(temper("sensitivity", recipe, "--candidate", "nope"), recipe, "--candidate",
                      "no candidate named 'nope'")


def test_sensitivity_candidate_without_static_quantize(temper, recipe):
    _assert_bad_input(temper("sensitivity", recipe, "--candidate", "fp16"), recipe, "candidates.fp16.steps",
                      "no static quantize step")


# 10. --require


def test_require_unknown_candidate_run_leaves_no_output(temper, recipe, tmp_path):
    out = tmp_path / "out"
    _assert_bad_input(temper("run", recipe, "-o", out, "--require", "nope"), recipe, "--require",
                      "no candidate named 'nope'", out=out)


@pytest.mark.slow
def test_require_accepts_the_name_of_a_search(temper, recipe, tmp_path):
    def change(d: dict[str, Any]) -> None:
        d["candidates"] = {"int8": {"max_trials": 2, "steps": [
            {"quantize": {"mode": "static", "format": ["qdq", "qoperator"]}}]}}
        d["validate"]["throughput"].update(duration_s=0.2, warmup_s=0.05)

    _edit(recipe, change)
    result = temper("run", recipe, "-o", tmp_path / "out", "--require", "int8")
    assert result.code in (0, 1), (result.code, result.stderr)
    assert "no candidate named" not in result.stderr, result.stderr
