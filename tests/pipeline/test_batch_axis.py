"""`batch_axis` naming an axis that does not hold the samples, through the installed console script:
`temper check` refuses it naming `batch_axis` (exit 2, one line), and so does `temper run` before it
builds anything, where it used to blame `batch_sizes` or gate the transposed data and exit 0. A model
whose batch dim is really fixed ([4, 6], [1, seq]) stays legitimate, and the batch sizes it cannot run
are found at check, not after the build."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper

TEMPER = str(Path(sys.executable).parent / "temper")
ROWS = 32


def _temper(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([TEMPER, *map(str, args)], capture_output=True, text=True, timeout=300)


def _model(path: Path, inputs: dict[str, list], width: int = 3) -> None:
    """y = (sum of the inputs) @ w: inputs [*, 4] ([4, 6]: w is [6, width]; [1, 'seq']: seq is 4 at run time)."""
    shape = next(iter(inputs.values()))
    rows = shape[-1] if isinstance(shape[-1], int) else 4
    weight = numpy_helper.from_array(np.random.default_rng(0).random((rows, width), dtype=np.float32), "w")
    names = list(inputs)
    nodes = [helper.make_node("Sum", names, ["s"]), helper.make_node("MatMul", ["s", "w"], ["y"])]
    values = [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()]
    output = helper.make_tensor_value_info("y", TensorProto.FLOAT, [shape[0], width])
    graph = helper.make_graph(nodes, "m", values, [output], [weight])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def _recipe(folder: Path, inputs: list[dict], graph: dict[str, list], *, row: int = 4, batch: int = 4,
            batch_sizes: list[int] | None = None) -> Path:
    _model(folder / "m.onnx", graph)
    rng = np.random.default_rng(1)
    np.savez(folder / "eval.npz", **{i["name"]: rng.standard_normal((ROWS, row)).astype(np.float32) for i in inputs})
    recipe = folder / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({
        "version": 1, "name": "axis",
        "model": {"onnx": "m.onnx", "inputs": inputs, "outputs": ["y"]},
        "data": {"evaluation": {"path": "eval.npz", "batch_size": batch}},
        "candidates": {"fp16": {"steps": ["fp16"]}},
        "validate": {"fidelity": {"cosine_min": 0.99},
                     "throughput": {"batch_sizes": batch_sizes or [batch], "duration_s": 0.1, "warmup_s": 0}},
    }, sort_keys=False))
    return recipe


def _one_line(result: subprocess.CompletedProcess[str], recipe: Path, key: str) -> str:
    assert result.returncode == 2 and "Traceback" not in result.stderr, (result.returncode, result.stderr)
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith(f"error: {recipe}: {key}: "), result.stderr
    return line


@pytest.mark.parametrize("sizes", [[4], [1, 8]], ids=["batch-size-equals-the-axis", "other-batch-sizes"])
def test_batch_axis_on_a_fixed_feature_axis_is_refused_at_check_and_run(tmp_path: Path, sizes: list[int]) -> None:
    """x [batch, 4] with batch_axis 1: its 4 features would be gated as the samples (batch size 4: exit 0
    on transposed data) or the run blamed batch_sizes after building every candidate."""
    recipe = _recipe(tmp_path, [{"name": "x", "shape": ["batch", 4], "batch_axis": 1}], {"x": ["batch", 4]},
                     batch_sizes=sizes)
    line = _one_line(_temper("check", recipe), recipe, "model.inputs[0].batch_axis")
    assert "'x': batch_axis 1 is m.onnx's fixed dim 4, but the baseline does not treat it as 4 samples" in line
    assert "set model.inputs[0].batch_axis: 0" in line
    out = tmp_path / "out"
    assert _one_line(_temper("run", recipe, "--output", out), recipe, "model.inputs[0].batch_axis") == line
    assert not out.exists()


def test_batch_axis_on_a_fixed_axis_where_another_input_holds_the_samples_is_refused(tmp_path: Path) -> None:
    """Two inputs [batch, 4], the second's batch_axis 1: the batch holds as many samples on every input."""
    recipe = _recipe(tmp_path, [{"name": "a", "shape": ["batch", 4]}, {"name": "b", "shape": ["batch", 4],
                                                                        "batch_axis": 1}],
                     {"a": ["batch", 4], "b": ["batch", 4]})
    line = _one_line(_temper("check", recipe), recipe, "model.inputs[1].batch_axis")
    assert "'b': batch_axis 1 is 4 in m.onnx, but 'a' holds the samples on a dim 'batch'" in line
    assert "set model.inputs[1].batch_axis: 0" in line


def test_a_model_with_a_really_fixed_batch_passes_and_its_batch_sizes_are_checked(tmp_path: Path) -> None:
    """x [4, 6]: four samples of six features, batch_axis 0; only batch size 4 runs, and check says so."""
    recipe = _recipe(tmp_path, [{"name": "x", "shape": [4, 6]}], {"x": [4, 6]}, row=6)
    result = _temper("check", recipe)
    assert result.returncode == 0, result.stderr
    data = yaml.safe_load(recipe.read_text())
    data["validate"]["throughput"]["batch_sizes"] = [4, 8]
    recipe.write_text(yaml.safe_dump(data, sort_keys=False))
    line = _one_line(_temper("check", recipe), recipe, "validate.throughput.batch_sizes[1]")
    assert "batch dim is fixed to 4, so batch size 8 cannot run" in line


def test_a_batch_of_one_with_an_open_sequence_axis_passes(tmp_path: Path) -> None:
    """x [1, seq] (exported at batch 1, sequence left open): batch_axis 0 holds its one sample."""
    recipe = _recipe(tmp_path, [{"name": "x", "shape": [1, "seq"]}], {"x": [1, "seq"]}, batch=1)
    result = _temper("check", recipe)
    assert result.returncode == 0, result.stderr
