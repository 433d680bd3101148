"""The batching helpers (artifacts/core/layout.py) and the recipe's batch axes: which axis holds the samples,
and moving them between the data's layout (samples first) and the model's."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from temper.artifacts.core import layout
from temper.artifacts.core.layout import Layout, default_axes
from temper.artifacts.formats.bundle import TensorSpec
from temper.pipeline.input_layout import layout_of
from temper.pipeline.recipe import ModelSpec

SILERO = {"audio": ["batch", 512], "sr": [], "state": [2, "batch", 128]}


def test_the_batch_axis_is_the_one_named_like_the_first_inputs_batch_dim() -> None:
    assert default_axes(SILERO) == {"audio": 0, "sr": None, "state": 1}
    assert default_axes({"ids": ["b", "seq"], "mask": ["seq", "b"]}) == {"ids": 0, "mask": 1}
    assert default_axes({"x": [1, 4], "h": [2, 1, 8]}) == {"x": 0, "h": 0}  # a fixed batch names nothing
    state_first = {"sr": [], "state": [2, "n", 8], "audio": [4, "n"]}  # the first batched input names it
    assert default_axes(state_first, {"state": 1}) == {"sr": None, "state": 1, "audio": 1}
    assert default_axes(state_first) == {"sr": None, "state": 0, "audio": 0}  # its axis 0 is 2: no name
    assert default_axes(SILERO, {"state": 2}) == {"audio": 0, "sr": None, "state": 2}


def test_feed_moves_rows_to_each_batch_axis_and_samples_moves_them_back() -> None:
    rows = {"audio": np.arange(3 * 4).reshape(3, 4), "state": np.arange(3 * 2 * 5).reshape(3, 2, 5)}
    lay = Layout({"audio": 0, "sr": None, "state": 1}, {"prob": 0, "stateN": 1}, {"sr": np.array(16000)})
    feed = lay.feed(rows)
    assert feed["state"].shape == (2, 3, 5) and feed["state"].flags.c_contiguous
    np.testing.assert_array_equal(feed["state"][:, 1], rows["state"][1])  # sample 1, in the model's layout
    assert feed["sr"] == 16000 and lay.rows(feed) == 3
    back = lay.samples({"prob": feed["audio"][:, :1], "stateN": feed["state"]})
    np.testing.assert_array_equal(back["stateN"], rows["state"])


def test_join_and_split_along_each_tensors_own_axis() -> None:
    axes = {"audio": 0, "sr": None, "state": 1}
    parts = [{"audio": np.full((n, 4), n), "sr": np.array(8000), "state": np.full((2, n, 5), n)} for n in (1, 2, 3)]
    joined = layout.join(parts, axes)
    assert joined["audio"].shape == (6, 4) and joined["state"].shape == (2, 6, 5) and joined["sr"].shape == ()
    again = layout.split(joined, axes, [1, 2, 3])
    for part, back in zip(parts, again):
        for name in part:
            np.testing.assert_array_equal(back[name], part[name])
    assert layout.take(joined, axes, 1, 3)["state"].shape == (2, 2, 5)


def test_the_recipe_resolves_batch_axes_and_holds_constants_to_their_shape_and_dtype() -> None:
    spec = ModelSpec(onnx="vad.onnx", outputs=["prob"], inputs=[
        {"name": "audio", "shape": ["batch", 512]}, {"name": "sr", "dtype": "int64", "shape": [], "value": 16000},
        {"name": "state", "shape": [2, "batch", 128]}])
    assert [i.batch_axis for i in spec.inputs] == [0, None, 1]
    lay = layout_of(spec.inputs)
    assert lay.constants["sr"].dtype == np.int64 and lay.constants["sr"] == 16000
    for bad, words in [({"name": "sr", "dtype": "int64", "shape": []}, "give the value"),
                       ({"name": "sr", "dtype": "int64", "shape": [], "value": 0.5}, "not a int64 tensor"),
                       ({"name": "t", "dtype": "uint8", "shape": [2], "value": [1, 300]}, "not a uint8 tensor"),
                       ({"name": "s", "shape": [2, "batch"], "batch_axis": 2}, "past the end"),
                       ({"name": "s", "shape": [1], "value": [1.0], "batch_axis": 0}, "no batch_axis")]:
        with pytest.raises(ValidationError, match=words):
            ModelSpec(onnx="m.onnx", outputs=["y"], inputs=[{"name": "x", "shape": ["batch", 2]}, bad])
    with pytest.raises(ValidationError, match="at least one must come from the data"):
        ModelSpec(onnx="m.onnx", outputs=["y"], inputs=[{"name": "sr", "dtype": "int64", "shape": [], "value": 1}])


def test_runtime_json_without_batch_axis_reads_as_before() -> None:
    """Bundles published before batch_axis: rows on axis 0, a scalar not batched."""
    assert TensorSpec(name="x", dtype="float32", shape=[-1, 4]).batch_axis == 0
    assert TensorSpec(name="sr", dtype="int64", shape=[]).batch_axis is None
    with pytest.raises(ValidationError, match="past the end"):
        TensorSpec(name="x", dtype="float32", shape=[-1], batch_axis=1)
