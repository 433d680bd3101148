"""predict(): batched evaluation equals one full run, fixed-batch models keep every row, fp16 comes back fp32."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from temper.artifacts.core import onnx_io
from temper.artifacts.core.errors import OptionError
from temper.validators.evaluate import predict

WEIGHTS = np.random.default_rng(0).standard_normal((3, 2)).astype(np.float32)
ROWS = np.random.default_rng(1).standard_normal((70, 3)).astype(np.float32)


def _matmul(path: Path, batch: int | str, out_type: int = TensorProto.FLOAT) -> Path:
    """x [batch, 3] @ W -> y [batch, 2], optionally cast to `out_type`."""
    nodes = [helper.make_node("MatMul", ["x", "W"], ["mm" if out_type != TensorProto.FLOAT else "y"])]
    if out_type != TensorProto.FLOAT:
        nodes.append(helper.make_node("Cast", ["mm"], ["y"], to=out_type))
    graph = helper.make_graph(
        nodes, "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3])],
        [helper.make_tensor_value_info("y", out_type, [batch, 2])],
        initializer=[numpy_helper.from_array(WEIGHTS, "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def _full_run(path: Path, rows: np.ndarray) -> np.ndarray:
    return onnx_io.session(path).run(["y"], {"x": rows})[0]


def test_batches_equal_one_full_batch_run(tmp_path: Path) -> None:
    path = _matmul(tmp_path / "dyn.onnx", "batch")
    got = predict(path, {"x": ROWS}, batch_size=32)  # 32 + 32 + a partial 6
    assert set(got) == {"y"} and got["y"].shape == (70, 2)
    np.testing.assert_array_equal(got["y"], _full_run(path, ROWS))


def test_fixed_batch_model_evaluates_the_partial_last_chunk(tmp_path: Path) -> None:
    dynamic = _matmul(tmp_path / "dyn.onnx", "batch")
    fixed = _matmul(tmp_path / "fixed.onnx", 4)
    rows = ROWS[:10]  # 4 + 4 + 2 padded to 4
    got = predict(fixed, {"x": rows}, batch_size=32)  # the fixed dim wins over the requested size
    assert got["y"].shape == (10, 2)
    np.testing.assert_array_equal(got["y"], _full_run(dynamic, rows))


def test_extra_feature_columns_are_ignored(tmp_path: Path) -> None:
    path = _matmul(tmp_path / "dyn.onnx", "batch")
    got = predict(path, {"x": ROWS, "unused": np.arange(70)}, batch_size=16)
    np.testing.assert_array_equal(got["y"], _full_run(path, ROWS))


def test_float16_outputs_come_back_as_float32(tmp_path: Path) -> None:
    path = _matmul(tmp_path / "half.onnx", "batch", TensorProto.FLOAT16)
    got = predict(path, {"x": ROWS}, batch_size=32)
    assert got["y"].dtype == np.float32
    np.testing.assert_allclose(got["y"], ROWS @ WEIGHTS, rtol=1e-2, atol=1e-2)


def test_data_that_does_not_fit_the_model_is_reported(tmp_path: Path) -> None:
    path = _matmul(tmp_path / "dyn.onnx", "batch")
    with pytest.raises(OptionError, match="model wants"):
        predict(path, {"x": np.zeros((5, 4), np.float32)}, batch_size=2)


def test_a_state_batched_on_axis_1_is_fed_and_scored_samples_first(tmp_path: Path) -> None:
    """Silero's layout: the evaluation rows are samples first, the model takes state [2, batch, 128] and a
    scalar sr; predict feeds each chunk in that layout and hands stateN back samples first."""
    import onnxruntime as ort

    from temper.artifacts.core.layout import Layout
    from tests.artifacts.runtimes import vad_model

    model = vad_model(tmp_path)
    rng = np.random.default_rng(3)
    rows = {"audio": rng.standard_normal((21, 64)).astype(np.float32),
            "state": rng.standard_normal((21, 2, 128)).astype(np.float32)}
    layout = Layout({"audio": 0, "sr": None, "state": 1}, {"prob": 0, "stateN": 1}, {"sr": np.array(16000)})
    got = predict(model, rows, batch_size=8, layout=layout)  # 8 + 8 + a partial 5
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    prob, state = session.run(None, {"audio": rows["audio"], "sr": np.array(16000, np.int64),
                                     "state": np.moveaxis(rows["state"], 0, 1).copy()})
    assert got["stateN"].shape == (21, 2, 128)
    np.testing.assert_allclose(got["prob"], prob, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["stateN"], np.moveaxis(state, 1, 0), rtol=1e-5, atol=1e-6)


# -- outputs kept between runs (pipeline.cache.OutputStore) ----------------------------------------
def test_kept_outputs_are_read_back_for_the_same_model_bytes_and_rows_only(tmp_path):
    from temper.pipeline.cache import OutputStore

    store = OutputStore(tmp_path / "outputs")
    model = _matmul(tmp_path / "m.onnx", "batch")
    first = predict(model, {"x": ROWS}, 16, kept=store)
    (stored,) = store.root.rglob("*.npz")
    written = stored.stat().st_ino
    again = predict(model, {"x": ROWS}, 16, kept=store)
    np.testing.assert_array_equal(again["y"], first["y"])
    # read back: a computed result is written aside and renamed over, a new file
    assert list(store.root.rglob("*.npz")) == [stored] and stored.stat().st_ino == written
    predict(model, {"x": ROWS[:60]}, 16, kept=store)  # other rows: computed and kept apart
    assert len(list(store.root.rglob("*.npz"))) == 2
    changed = onnx.load(str(model))  # same file name, other weights: other outputs
    changed.graph.initializer[0].CopyFrom(numpy_helper.from_array(2 * WEIGHTS, "W"))
    onnx.save(changed, str(model))
    np.testing.assert_allclose(predict(model, {"x": ROWS}, 16, kept=store)["y"], 2 * first["y"], rtol=1e-6)


def test_external_weights_are_part_of_what_kept_outputs_depend_on(tmp_path):
    from temper.pipeline.cache import OutputStore

    store = OutputStore(tmp_path / "outputs")
    model = _matmul(tmp_path / "m.onnx", "batch")
    proto = onnx.load(str(model))
    onnx.save(proto, str(model), save_as_external_data=True, all_tensors_to_one_file=True, location="m.data",
              size_threshold=0)
    first = predict(model, {"x": ROWS}, 16, kept=store)["y"]
    proto.graph.initializer[0].CopyFrom(numpy_helper.from_array(-WEIGHTS, "W"))
    onnx.save(proto, str(model), save_as_external_data=True, all_tensors_to_one_file=True, location="m.data",
              size_threshold=0)  # only m.data differs in the values; model.onnx may stay byte for byte
    np.testing.assert_allclose(predict(model, {"x": ROWS}, 16, kept=store)["y"], -first, rtol=1e-6)
