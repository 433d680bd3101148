"""(model, engine) pairs: every model on every engine, named so a one-engine recipe reads as before."""

from __future__ import annotations

from temper.validators.pairs import Pair, pairs, reference, split


def test_every_model_meets_every_engine_baseline_first_on_each():
    found = pairs(["int8", "fp16"], ["cpu", "openvino"])
    assert [(p.model, p.provider) for p in found] == [
        ("baseline", "cpu"), ("int8", "cpu"), ("fp16", "cpu"),
        ("baseline", "openvino"), ("int8", "openvino"), ("fp16", "openvino")]
    assert reference(["openvino", "cpu"]) == Pair("baseline", "openvino")


def test_names_on_the_first_engine_are_the_models_and_split_inverts_them():
    keys = [p.key("cpu") for p in pairs(["int8"], ["cpu", "openvino-bf16"])]
    assert keys == ["baseline", "int8", "baseline@openvino-bf16", "int8@openvino-bf16"]
    assert [split(k, "cpu") for k in keys] == pairs(["int8"], ["cpu", "openvino-bf16"])
