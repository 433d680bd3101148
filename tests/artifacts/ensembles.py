"""The ensemble tests' harness: two real stages, a normalisation model and a digits-like CNN (test_perf_analyzer's),
exported into one repository with `export_repository`, the ensemble that chains them written by `export_ensemble`,
and the reference: ONNX Runtime running the two stages one after the other."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from temper.artifacts.triton.config import export_repository
from temper.artifacts.triton.ensemble import export_ensemble
from tests.artifacts.servers import _bundle
from tests.artifacts.test_perf_analyzer import _cnn

PIPELINE, NORMALIZE, CNN = "digits", "normalize", "cnn"
MEAN, STD = 4.5, 2.5


def normalize_model(path: Path) -> Path:
    """pixels [batch, 1, 8, 8] in 0..16 -> image = (pixels - MEAN) / STD, the CNN's input."""
    mean = numpy_helper.from_array(np.array(MEAN, np.float32), "mean")
    std = numpy_helper.from_array(np.array(STD, np.float32), "std")
    graph = helper.make_graph(
        [helper.make_node("Sub", ["pixels", "mean"], ["centred"]),
         helper.make_node("Div", ["centred", "std"], ["image"])],
        "normalize", [helper.make_tensor_value_info("pixels", TensorProto.FLOAT, ["batch", 1, 8, 8])],
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 1, 8, 8])], [mean, std])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def make_pipeline_repository(root: Path, ensemble: bool = True) -> Path:
    """root/repo holding normalize/1 and cnn/1 (max batch 8 and 16) and, with `ensemble`, digits chaining them."""
    repo = root / "repo"
    export_repository(_bundle(root / "normalize", normalize_model(root / "normalize.onnx"), NORMALIZE,
                              max_batch_size=8, max_delay_ms=2), repo)
    export_repository(_bundle(root / "cnn", _cnn(root / "cnn.onnx"), CNN, max_batch_size=16, max_delay_ms=2), repo)
    if ensemble:
        export_ensemble(repo, PIPELINE, [NORMALIZE, CNN])
    return repo


class Chained:
    """The two stages in ONNX Runtime, one after the other: what the ensemble must answer."""

    def __init__(self, repo: Path) -> None:
        self.stages = [ort.InferenceSession(str(repo / name / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
                       for name in (NORMALIZE, CNN)]

    def __call__(self, pixels: np.ndarray) -> np.ndarray:
        (image,) = self.stages[0].run(["image"], {"pixels": pixels})
        (logits,) = self.stages[1].run(["logits"], {"image": image})
        return logits


def pixels(seed: int, rows: int = 2) -> np.ndarray:
    return np.random.default_rng(seed).uniform(0, 16, (rows, 1, 8, 8)).astype(np.float32)
