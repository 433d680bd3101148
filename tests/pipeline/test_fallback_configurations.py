"""The fallback tries configurations before putting nodes back in float: per-channel weights when the
step had per-tensor, then percentile calibration when it had minmax, each on the best so far. On a
real Conv whose per-tensor weight scale a dead channel's huge weight ruins (as BatchNorm folding leaves
on dead channels), per-channel weights alone meet the budget and no node goes float."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from temper.artifacts.core import onnx_io
from temper.pipeline.quantize_backends import OrtOptions
from temper.pipeline.steps.base import StepContext
from temper.pipeline.steps.quantize import Quantize
from temper.validators.census import of_file
from temper.validators.scoring import Score


def dead_channel_conv(path: Path) -> Path:
    """1x1 Conv over 17 channels; channel 16 is always zero and output 7 reads only it, with weight 1000."""
    weight = np.random.default_rng(0).normal(0, 0.3, (8, 17, 1, 1)).astype(np.float32)
    weight[:, 16] = 0.0
    weight[7] = 0.0
    weight[7, 16] = 1000.0
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], name="conv")], "dead",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 17, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8, 4, 4])],
                              [numpy_helper.from_array(weight, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(path))
    return path


def batches(count: int = 4) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(1)
    out = []
    for _ in range(count):
        x = rng.normal(0, 1, (32, 17, 4, 4)).astype(np.float32)
        x[:, 16] = 0.0
        out.append({"x": x})
    return out


class CosineScorer:
    """The budget as cosine to the FP32 model's outputs on held-out batches (drop = 1 - cosine)."""

    metric, baseline_metric = "cosine", 1.0

    def __init__(self, src: Path, allowed_drop: float) -> None:
        self.allowed_drop = allowed_drop
        self.data = batches(2)
        self.reference = np.concatenate([onnx_io.run(src, b)[0] for b in self.data]).ravel().astype(np.float64)

    def score(self, model: Path) -> Score:
        out = np.concatenate([onnx_io.run(model, b)[0] for b in self.data]).ravel().astype(np.float64)
        norms = np.linalg.norm(self.reference) * np.linalg.norm(out)
        cosine = float(self.reference @ out / norms) if norms else 0.0
        return Score(cosine, 1.0 - cosine, cosine, [])

    def speed(self, model: Path) -> float | None:
        return None


def _tune(tmp_path: Path, allowed_drop: float, **fallback: object) -> tuple[dict, list[str], Path]:
    src = dead_channel_conv(tmp_path / "dead.onnx")
    notes: list[str] = []
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    # progress notes and the lines a finished trial or configuration logs (a CI log's lines) alike
    ctx = StepContext([], batches, lambda: batches(1)[0], scratch, lambda: CosineScorer(src, allowed_drop),
                      notes.append, log=notes.append)
    options = OrtOptions(mode="static", preset=None, fallback={"max_trials": 4, **fallback})
    dst = tmp_path / "out" / "model.onnx"
    dst.parent.mkdir()
    Quantize().run(src, dst, options, ctx)
    return json.loads((dst.parent / "tuning.json").read_text()), notes, dst


def test_per_channel_weights_meet_the_budget_before_any_node_goes_float(tmp_path):
    tuning, notes, dst = _tune(tmp_path, allowed_drop=0.05)
    plain, fixed = tuning["trials"]
    assert plain["kind"] == "plain" and not plain["passed"] and plain["configuration"] == {}
    assert (fixed["kind"], fixed["float_nodes"], fixed["configuration"]) == ("configuration", [], {"per_channel": True})
    assert fixed["passed"] and tuning["met"] and tuning["best"] == 1
    assert tuning["configuration"] == {"per_channel": True}
    assert [c["changes"] for c in tuning["configurations"]] == [{"per_channel": True}]  # met: percentile not tried
    assert tuning["ranking"] == []  # no node had to go float, so nothing was ranked
    # the written model is the per-channel one: one scale per output channel, and the census says INT8
    model = onnx.load(str(dst))
    scales = {i.name: numpy_helper.to_array(i).size for i in model.graph.initializer}
    dequantize = [n for n in model.graph.node if n.op_type == "DequantizeLinear"]
    assert sorted(scales.get(n.input[1], 1) for n in dequantize) == [1, 1, 8]  # x and y per tensor, w per channel
    assert of_file(dst).quantized == 1
    assert any(n.startswith("fallback: configuration per_channel: True: 1 quantized nodes") for n in notes), notes


def test_each_configuration_builds_on_the_best_so_far_and_the_search_starts_from_it(tmp_path):
    tuning, _, _ = _tune(tmp_path, allowed_drop=1e-9)  # nothing INT8 holds it
    assert [c["changes"] for c in tuning["configurations"]] == [
        {"per_channel": True}, {"per_channel": True, "calibration": "percentile"}]
    assert tuning["configuration"]["per_channel"] is True
    configured = [t for t in tuning["trials"] if t["kind"] != "plain"]
    assert configured and all(t["configuration"] == tuning["configuration"] for t in configured)
    assert not tuning["met"] and tuning["floor_reached"]  # one Conv: putting it in float is below the floor


def test_configurations_false_keeps_the_steps_own(tmp_path):
    tuning, _, _ = _tune(tmp_path, allowed_drop=0.05, configurations=False)
    assert tuning["configurations"] == [] and tuning["configuration"] == {}
    assert [t["kind"] for t in tuning["trials"]] == ["plain"] and not tuning["met"]


@pytest.mark.parametrize(("given", "tried"), [
    ({"per_channel": True, "calibration": "entropy"}, []),
    ({"per_channel": True}, [{"calibration": "percentile"}]),
    ({"calibration": "percentile"}, [{"per_channel": True}]),
])
def test_only_the_weaker_settings_are_changed(given, tried):
    from temper.pipeline.steps.quantize.fallback import alternatives

    assert alternatives(OrtOptions(mode="static", preset=None, **given)) == tried
