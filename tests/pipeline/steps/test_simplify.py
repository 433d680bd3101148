"""The simplify step on tiny real models: outputs kept, graphs shrink, failures are loud."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from temper.artifacts.core import onnx_io
from temper.artifacts.core.errors import StepFailed
from temper.pipeline.step_options import SimplifyOptions
from temper.pipeline.steps.simplify import Simplify

STEP = Simplify()


def _graph_model(nodes: list, inits: list, path: Path, opsets: dict[str, int] | None = None) -> Path:
    """x [batch, 4] -> y [batch, 4] float graph, saved to `path`."""
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        inits,
    )
    imports = [helper.make_opsetid(domain, version) for domain, version in {"": 17, **(opsets or {})}.items()]
    model = helper.make_model(graph, opset_imports=imports)
    model.ir_version = 9
    onnx.save(model, str(path))
    return path


def _nodes(path: Path) -> list[str]:
    return [n.op_type for n in onnx_io.load_structure(path).graph.node]


def test_cnn_outputs_match_and_graph_does_not_grow(tiny_cnn_path: Path, tmp_path: Path, make_context) -> None:
    batch = {"pixels": np.random.default_rng(0).standard_normal((3, 1, 8, 8)).astype(np.float32)}
    dst = tmp_path / "simple.onnx"
    STEP.run(tiny_cnn_path, dst, SimplifyOptions(check_n=2), make_context(batch))
    np.testing.assert_allclose(onnx_io.run(dst, batch)[0], onnx_io.run(tiny_cnn_path, batch)[0], rtol=1e-4, atol=1e-5)
    assert len(_nodes(dst)) <= len(_nodes(tiny_cnn_path))


def test_external_data_input(tiny_cnn_path: Path, tmp_path: Path, make_context, external_data_copy) -> None:
    src = external_data_copy(tiny_cnn_path)
    batch = {"pixels": np.random.default_rng(3).standard_normal((2, 1, 8, 8)).astype(np.float32)}
    dst = tmp_path / "simple.onnx"
    STEP.run(src, dst, SimplifyOptions(), make_context(batch))
    np.testing.assert_allclose(onnx_io.run(dst, batch)[0], onnx_io.run(tiny_cnn_path, batch)[0], rtol=1e-4, atol=1e-5)


def test_symbolic_dims_survive_and_check_uses_real_shapes(
    tiny_transformer_like_path: Path, tmp_path: Path, make_context
) -> None:
    # `seq` is symbolic past the leading axis: onnxsim's own check cannot size it without the batch.
    rng = np.random.default_rng(1)
    dst = tmp_path / "simple.onnx"
    sample = {"hidden": rng.standard_normal((2, 5, 16)).astype(np.float32)}
    STEP.run(tiny_transformer_like_path, dst, SimplifyOptions(), make_context(sample))
    assert onnx_io.dims(onnx_io.load_structure(dst)) == {"hidden": ["batch", "seq", 16]}
    other = {"hidden": rng.standard_normal((3, 9, 16)).astype(np.float32)}
    expected = onnx_io.run(tiny_transformer_like_path, other)[0]
    np.testing.assert_allclose(onnx_io.run(dst, other)[0], expected, rtol=1e-4, atol=1e-5)


def test_constant_subgraphs_fold_away(tmp_path: Path, make_context) -> None:
    src = _graph_model(
        [
            helper.make_node("Add", ["one", "ramp"], ["c"], name="fold_me"),
            helper.make_node("Identity", ["c"], ["c1"], name="id1"),
            helper.make_node("Identity", ["c1"], ["c2"], name="id2"),
            helper.make_node("Add", ["x", "c2"], ["y"], name="add"),
        ],
        [
            numpy_helper.from_array(np.ones(4, np.float32), "one"),
            numpy_helper.from_array(np.arange(4, dtype=np.float32), "ramp"),
        ],
        tmp_path / "foldable.onnx",
    )
    batch = {"x": np.arange(8, dtype=np.float32).reshape(2, 4)}
    dst = tmp_path / "simple.onnx"
    STEP.run(src, dst, SimplifyOptions(), make_context(batch))
    assert _nodes(dst) == ["Add"]
    np.testing.assert_array_equal(onnx_io.run(dst, batch)[0], batch["x"] + 1 + np.arange(4))


def test_op_unknown_to_onnxruntime_fails_the_step(tmp_path: Path, make_context) -> None:
    custom = helper.make_node("Frobnicate", ["x"], ["y"], domain="acme", name="custom")
    src = _graph_model([custom], [], tmp_path / "custom.onnx", {"acme": 1})
    dst = tmp_path / "simple.onnx"
    with pytest.raises(StepFailed, match=r"^simplify: onnx-simplifier failed: .*acme:Frobnicate"):
        STEP.run(src, dst, SimplifyOptions(check_n=1), make_context({"x": np.ones((2, 4), np.float32)}))
    assert not dst.exists()


def test_unchecked_result_that_onnxruntime_rejects_fails_the_step(tmp_path: Path, make_context) -> None:
    # float + int64: onnx's checker lets it through, so onnxsim with check_n 0 reports success.
    src = _graph_model(
        [helper.make_node("Add", ["x", "k"], ["y"], name="mismatched")],
        [numpy_helper.from_array(np.ones(4, np.int64), "k")],
        tmp_path / "mismatched.onnx",
    )
    with pytest.raises(StepFailed, match=r"^simplify: .*does not load in onnxruntime: .*mismatched"):
        STEP.run(src, tmp_path / "simple.onnx", SimplifyOptions(check_n=0),
                 make_context({"x": np.ones((2, 4), np.float32)}))


def test_a_failure_inside_an_if_branch_names_the_node_and_the_way_out(tmp_path: Path, make_context) -> None:
    """onnx's checker reports a branch out of order over three lines, the node on the second: the line keeps it
    (onnxsim broke Silero VAD's inlined If this way; here the branch comes out of order, the same error)."""
    weight = numpy_helper.from_array(np.eye(4, dtype=np.float32), "w")
    then = helper.make_graph(  # Relu before the MatMul whose output it reads
        [helper.make_node("Relu", ["h"], ["t"], name="then_relu"), helper.make_node("MatMul", ["x", "w"], ["h"])],
        "then", [], [helper.make_tensor_value_info("t", TensorProto.FLOAT, ["batch", 4])], [weight])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, ["batch", 4])])
    src = _graph_model([helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
                        helper.make_node("Greater", ["s", "zero"], ["c"]),
                        helper.make_node("If", ["c"], ["y"], name="branch", then_branch=then, else_branch=other)],
                       [numpy_helper.from_array(np.array(0.0, np.float32), "zero")], tmp_path / "unsorted.onnx")
    with pytest.raises(StepFailed) as err:
        STEP.run(src, tmp_path / "simple.onnx", SimplifyOptions(), make_context({"x": np.ones((2, 4), np.float32)}))
    message = str(err.value)
    assert message.startswith("simplify: onnx-simplifier failed: RuntimeError: Nodes in a graph must be "
                              "topologically sorted, however input 'h' of node: name: then_relu OpType: Relu is not "
                              "output of any previous nodes; remove this simplify step (the cost: "), message
    assert "\n" not in message
