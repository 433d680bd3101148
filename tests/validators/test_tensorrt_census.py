"""The TensorRT engine census reads the engine inspector's JSON (its documented layer format; to be replaced by
output recorded on a GPU) and gates a tensorrt pair whose engine does not compute in its graph's precision."""

from __future__ import annotations

import json
from pathlib import Path

from temper.validators.tensorrt_census import from_inspector, gate

DATA = Path(__file__).parent / "data"


def test_an_fp16_candidate_whose_engine_runs_fp32_fails_in_one_line():
    census = from_inspector((DATA / "tensorrt_inspector_fp32.json").read_text())
    assert census.layers == 2 and census.by_precision == {"fp32": 2}  # the Reformat layer is not compute
    failed = gate(census, "fp16")
    assert failed is not None and not failed.passed and failed.provider == "tensorrt"
    assert "\n" not in failed.detail
    assert failed.detail.startswith("TensorRT built 0 of 2 compute layers in FP16")
    assert failed.detail.endswith("the engine of this FP16 candidate runs FP32")


def test_an_engine_computing_fp16_passes_and_fp32_or_names_only_are_not_gated():
    census = from_inspector((DATA / "tensorrt_inspector_fp16.json").read_text())
    assert census.by_precision == {"fp16": 2}
    passed = gate(census, "fp16")
    assert passed is not None and passed.passed and passed.measured == 2.0
    assert gate(census, "fp32") is None
    names_only = from_inspector(json.dumps({"Layers": ["/conv1/Conv + /relu/Relu", "/fc/Gemm"],
                                            "Bindings": ["input", "logits"]}))
    assert not names_only.detailed and names_only.layers == 2 and gate(names_only, "int8-static") is None


def test_an_int8_candidate_needs_int8_layers():
    census = from_inspector((DATA / "tensorrt_inspector_fp16.json").read_text())
    failed = gate(census, "int8-static")
    assert failed is not None and not failed.passed and "runs FP16" in failed.detail
