"""The digits recipe on two engines, ONNX Runtime's CPU and OpenVINO (and openvino-bf16 on a CPU with native
BF16): every model is a pair on each, gated on its own engine's outputs and speed against the baseline on the
first engine, and selection picks a pair whose engine, precision (read back from OpenVINO's compiled model)
and settings report.json records."""

from __future__ import annotations

import json

import pytest

from temper.artifacts.core.host import profile
from temper.artifacts.engines.providers import BF16_FLAGS
from tests.helpers import edit_recipe
from tests.unit.reports import read_report

pytest.importorskip("openvino", reason="the openvino engine needs openvino (the openvino extra, in dev)")

# On a CPU with native BF16 the run also measures openvino-bf16: its pairs are gated on their own BF16 outputs.
NATIVE_BF16 = any(f in profile().features for f in BF16_FLAGS)


@pytest.mark.slow
def test_pairs_on_cpu_and_openvino_are_gated_and_one_is_selected(temper, gated_digits, tmp_path):
    engines = ["openvino", *(["openvino-bf16"] if NATIVE_BF16 else [])]
    edit_recipe(gated_digits, lambda d: (d["validate"]["throughput"].update(providers=["cpu", *engines]),
                                         d.pop("publish")))
    out = tmp_path / "out"
    result = temper("run", gated_digits, "--output", out)
    assert result.code == 0, result.stderr
    report = read_report(out)
    assert report["schema_version"] == 6 and report["baseline"]["engine"] == "cpu"
    models = ["fp16", "int8-static", "int8-dynamic"]
    expected = models + [f"{m}@{engine}" for engine in engines for m in ["baseline", *models]]
    assert list(report["candidates"]) == expected
    for key, pair in report["candidates"].items():
        model, _, engine = key.partition("@")
        assert (pair["model"], pair["engine"]) == (model, engine or "cpu")
        assert [m["provider"] for m in pair["throughput"]] == [pair["engine"]] * 3  # batch 1, 8, 32
        speed_gates = [g for g in pair["gates"] if g["kind"] == "throughput"]
        assert {g["provider"] for g in speed_gates} == {pair["engine"]}
        if pair["engine"] == "openvino":
            # the precision the engine computes in, read back from the compiled model, never assumed
            assert pair["engine_precision"] == "f32"
            assert all(m["session"]["inference_precision"] == "f32" and m["session"]["num_streams"] == 1
                       for m in pair["throughput"])
            assert pair["fidelity"][0]["cosine"] > 0.999 or model != "baseline"
        elif pair["engine"] == "openvino-bf16":  # BF16 compute: recorded and gated as BF16, on its own outputs
            assert pair["engine_precision"] == "bf16"
            assert all(m["session"]["inference_precision"] == "bf16" for m in pair["throughput"])
            assert model != "baseline" or 0.99 < pair["fidelity"][0]["cosine"] < report["candidates"][
                "baseline@openvino"]["fidelity"][0]["cosine"]  # BF16 moves the outputs more than FP32 does
        else:
            assert pair["engine_precision"] is None and "intra_op_threads" in pair["throughput"][0]["session"]
    # selection: of the passing pairs whose interval at batch 32 lies above 1.0 (over baseline on cpu), the
    # largest speedup, or one tied with it on their paired interval (the more faithful)
    passing = {k: max(c["throughput"], key=lambda m: m["batch_size"]) for k, c in report["candidates"].items()
               if c["passed"]}
    faster = {k: m for k, m in passing.items() if m["speedup_interval"][0] > 1.0}
    leader = max(faster, key=lambda k: faster[k]["speedup"]) if faster else "baseline"
    picked, tied = report["selected_pair"], {t["pair"] for t in report["ties"]}
    assert (picked == leader or (picked in faster and leader in tied)) and report["passed"] == bool(faster)
    chosen = report["candidates"].get(picked)
    assert report["selected"] == (chosen["model"] if chosen else "baseline")
    assert report["selected_engine"] == (chosen["engine"] if chosen else "cpu")
    assert f"selected: {picked}" in result.stdout and f"on `{report['selected_engine']}`" in result.stdout
    text = (out / "report.md").read_text()
    serving = f"Serving: `{report['selected']}` on `{report['selected_engine']}`"
    assert "int8-static@openvino" in text and serving in text
    # what `temper serve OUTPUT` would run: the selected pair's engine and recorded settings
    from temper.pipeline.outputs import servable

    folder, config = servable(out)
    assert folder.name == report["selected"] and config.engine == report["selected_engine"]
    recorded = json.loads(config.model_dump_json())["session"]
    pair = chosen["throughput"][0]["session"] if chosen else report["baseline"]["throughput"][0]["session"]
    assert recorded == pair


@pytest.mark.slow
@pytest.mark.skipif(any(f in profile().features for f in BF16_FLAGS),
                    reason="premise: a CPU without native BF16 (no avx512_bf16 or amx_bf16); "
                           "this one has it, so openvino-bf16 is allowed here")
def test_openvino_bf16_on_a_cpu_without_native_bf16_is_exit_3_at_check(temper, gated_digits):
    edit_recipe(gated_digits, lambda d: d["validate"]["throughput"].update(providers=["cpu", "openvino-bf16"]))
    result = temper("check", gated_digits)
    assert result.code == 3
    lines = [line for line in result.stderr.splitlines() if "openvino-bf16" in line]
    assert len(lines) == 1 and "validate.throughput.providers" in lines[0] and "native BF16" in lines[0], result.stderr
