"""A model that branches on a constant input, as Silero VAD does on its sample rate `sr` (issue 33.5), through
the console script: onnx-simplifier checks on the recipe's constants, not random values (which run the branch
the model cannot run), and a quantize step whose compute all lies inside If branches ends the same way in
`temper check` (forecast) and `temper run` (which prints that forecast too): rejected, never a build error."""

from __future__ import annotations

from tests.pipeline.test_console_log import rate_recipe, temper

FORECAST = ("candidates.int8.steps[0].quantize: 2 of 2 compute nodes are inside If/Loop/Scan subgraphs, which "
            "ONNX Runtime's quantizer leaves in float: this step will quantize nothing and its candidate will be "
            "rejected")


def test_the_shared_simplify_checks_on_the_recipe_constants(tmp_path):
    recipe = rate_recipe(tmp_path, ["simplify"])
    result = temper("run", recipe, "--output", tmp_path / "out", "--cache-dir", tmp_path / "cache")
    assert result.returncode == 0, result.stderr
    assert "✓ baseline › simplify" in result.stderr, result.stderr


def test_a_quantize_step_inside_branches_is_rejected_by_run_as_check_forecasts(tmp_path):
    recipe = rate_recipe(tmp_path, [], candidates={"int8": {"steps": [{"quantize": {"mode": "static"}}]}})
    checked = temper("check", recipe, "--cache-dir", tmp_path / "cache")
    assert checked.returncode == 0, checked.stderr
    assert FORECAST in " ".join(checked.stdout.split()), checked.stdout
    ran = temper("run", recipe, "--output", tmp_path / "out", "--cache-dir", tmp_path / "cache")
    said = " ".join((ran.stdout + ran.stderr).split())
    assert ran.returncode == 0, said  # a rejection is a failed gate: the baseline is selected
    assert f"! {FORECAST}" in said, said
    assert ("rejected: candidate int8 did not build: quantize wrote no quantized node (0 of 2 eligible; 2 are "
            "inside If/Loop/Scan subgraphs" in said), said
    assert "quant_pre_process" not in said and "build error" not in said, said
