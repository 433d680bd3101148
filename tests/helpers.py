"""What many test modules share that is not a fixture: the repository's paths, recipe editing and writing,
and the small ONNX graphs several gates are tested on. Fixtures stay in conftest.py; a test module imports
these by name (`from tests.helpers import ...`), never from a conftest."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import yaml
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parents[1]
RECIPES = REPO / "recipes"

Shape = Sequence[int | str]


@dataclass
class CliResult:
    """What the `temper` fixture returns: the exit code and both streams."""

    code: int
    stdout: str
    stderr: str


def edit_recipe(recipe: Path, change: Callable[[dict[str, Any]], Any]) -> None:
    """Apply `change` to the recipe's YAML mapping in place."""
    data = yaml.safe_load(recipe.read_text())
    change(data)
    recipe.write_text(yaml.safe_dump(data, sort_keys=False))


def save_graph(path: Path, nodes: list[onnx.NodeProto], inputs: Mapping[str, Shape], outputs: Mapping[str, Shape],
               weights: Mapping[str, np.ndarray] | None = None, name: str = "graph") -> Path:
    """An FP32 ONNX model (opset 17) of `nodes`, its inputs and outputs float tensors of the given shapes."""
    graph = helper.make_graph(
        nodes, name, [helper.make_tensor_value_info(k, TensorProto.FLOAT, list(v)) for k, v in inputs.items()],
        [helper.make_tensor_value_info(k, TensorProto.FLOAT, list(v)) for k, v in outputs.items()],
        [numpy_helper.from_array(value, key) for key, value in (weights or {}).items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def mixed_model(path: Path, classes: int = 6, boxes: int = 4, flip_scores: bool = False) -> Path:
    """A detector's head in miniature: out = concat(x @ wb (hundreds of pixels), sigmoid(x @ ws) (0..1)),
    [batch, boxes + classes], so a whole-output cosine is dominated by the boxes. `flip_scores`: an edited
    copy whose score weights are negated, so only the small part changes."""
    rng = np.random.default_rng(0)
    wb = (rng.random((4, boxes)) * 300).astype(np.float32)
    ws = rng.normal(size=(4, classes)).astype(np.float32) * (-1 if flip_scores else 1)
    nodes = [helper.make_node("MatMul", ["x", "wb"], ["boxes"], name="box"),
             helper.make_node("MatMul", ["x", "ws"], ["logit"], name="score"),
             helper.make_node("Sigmoid", ["logit"], ["scores"], name="sigmoid"),
             helper.make_node("Concat", ["boxes", "scores"], ["out"], axis=1, name="concat")]
    return save_graph(path, nodes, {"x": ["batch", 4]}, {"out": ["batch", boxes + classes]}, {"wb": wb, "ws": ws},
                      name="mixed")


def write_recipe(folder: Path, name: str, model: dict[str, Any], data: Mapping[str, np.ndarray],
                 candidates: dict[str, Any], validate: dict[str, Any] | None = None,
                 evaluation: Mapping[str, np.ndarray] | None = None, **extra: Any) -> Path:
    """folder/recipe.yaml over folder's ONNX model: `data` saved as the calibration set (calib.npz) and,
    unless `evaluation` is given, as the evaluation set too; batches of 16."""
    np.savez(folder / "calib.npz", **data)
    np.savez(folder / "eval.npz", **(data if evaluation is None else evaluation))
    recipe = folder / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({
        "version": 1, "name": name, "model": model,
        "data": {"calibration": {"path": "calib.npz", "batch_size": 16},
                 "evaluation": {"path": "eval.npz", "batch_size": 16}},
        "candidates": candidates, **({"validate": validate} if validate is not None else {}), **extra},
        sort_keys=False))
    return recipe


STATIC_INT8 = {"steps": [{"quantize": {"mode": "static", "format": "qdq"}}]}
MIXED = {"onnx": "mixed.onnx", "inputs": [{"name": "x", "shape": ["batch", 4]}], "outputs": ["out"]}
