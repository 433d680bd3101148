"""The export step: real torch.onnx.export, dynamic axes from symbolic dims, checked against torch."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch

from temper.artifacts.core.errors import StepFailed
from temper.pipeline.recipe import ModelSpec
from temper.pipeline.steps.export import dynamic_axes, export


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(1, 4, 3, padding=1)
        self.fc = torch.nn.Linear(4 * 8 * 8, 10)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv(pixels)).flatten(1))


class CountsCalls(Net):
    """Python-side state baked into the graph at export time: the classic export pitfall."""

    calls = 0

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return super().forward(pixels) * float(self.calls)


def _spec(dynamo: bool, **export) -> ModelSpec:
    return ModelSpec(factory="m.py:f", inputs=[{"name": "pixels", "shape": ["batch", 1, 8, 8]}],
                     outputs=["logits"], export={"dynamo": dynamo, **export})


def _batch(n: int) -> dict[str, np.ndarray]:
    return {"pixels": np.random.default_rng(n).random((n, 1, 8, 8), dtype=np.float32)}


@pytest.mark.parametrize("dynamo", [True, False])
def test_export_is_dynamic_in_batch_and_matches_torch(tmp_path, dynamo):
    net = Net().eval()
    dst = tmp_path / "model.onnx"
    export(net, _spec(dynamo), _batch(4), dst, tmp_path)
    assert not (tmp_path / "model.onnx.data").exists()  # weights inlined below 2 GB
    session = ort.InferenceSession(str(dst), providers=["CPUExecutionProvider"])
    assert session.get_inputs()[0].shape[0] == "batch"
    for n in (1, 7):  # sizes the export never saw
        got = session.run(None, _batch(n))[0]
        with torch.no_grad():
            want = net(torch.from_numpy(_batch(n)["pixels"])).numpy()
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-3)


def test_export_mismatch_with_torch_is_an_error(tmp_path):
    with pytest.raises(StepFailed, match="ONNX output differs from torch beyond atol"):
        export(CountsCalls().eval(), _spec(False), _batch(4), tmp_path / "model.onnx", tmp_path)


def test_wrong_output_count_is_an_error(tmp_path):
    spec = ModelSpec(factory="m.py:f", inputs=[{"name": "pixels", "shape": ["batch", 1, 8, 8]}],
                     outputs=["logits", "extra"], export={"dynamo": False})
    with pytest.raises(StepFailed):
        export(Net().eval(), spec, _batch(2), tmp_path / "model.onnx", tmp_path)


def test_dynamic_axes_follow_symbolic_dims():
    spec = ModelSpec(factory="m.py:f", outputs=["emb"], inputs=[
        {"name": "ids", "dtype": "int64", "shape": ["batch", "seq"]},
        {"name": "mask", "dtype": "int64", "shape": ["batch", 128]},
    ])
    assert dynamic_axes(spec) == {"ids": {0: "batch", 1: "seq"}, "mask": {0: "batch"}, "emb": {0: "batch"}}
