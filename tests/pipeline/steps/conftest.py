"""Tiny real models for step tests, exported once per session: treat the files as read-only."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import onnx
import pytest
import torch
from torch import nn

from temper.artifacts.core.onnx_io import Batch
from temper.pipeline.steps.base import StepContext


class TinyCnn(nn.Module):
    """A typical small conv net; the TorchScript exporter already folds the BatchNorm into the Conv."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4 * 8 * 8, 10)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.bn(self.conv(pixels))).flatten(1))


class TinyAttention(nn.Module):
    """One pre-norm self-attention block: LayerNormalization, MatMul, Softmax, residual Add. With heads > 1
    the projections split into heads as BERT's do (Reshape, Transpose): the graph attention patterns match."""

    def __init__(self, width: int = 16, heads: int = 1) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.q, self.k, self.v, self.o = (nn.Linear(width, width) for _ in range(4))
        self.heads = heads
        self.scale = (width // heads) ** -0.5

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        h = self.norm(hidden)
        if self.heads == 1:
            weights = torch.softmax(self.q(h) @ self.k(h).transpose(1, 2) * self.scale, dim=-1)
            return hidden + self.o(weights @ self.v(h))
        batch, seq, width = hidden.shape

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.reshape(batch, seq, self.heads, width // self.heads).transpose(1, 2)

        q, k, v = split(self.q(h)), split(self.k(h)), split(self.v(h))
        weights = torch.softmax(q @ k.transpose(2, 3) * self.scale, dim=-1)
        return hidden + self.o((weights @ v).transpose(1, 2).reshape(batch, seq, width))


def _export(module: nn.Module, example: torch.Tensor, path: Path, input_name: str, axes: dict[int, str]) -> Path:
    torch.onnx.export(
        module.eval(),
        (example,),
        str(path),
        dynamo=False,
        opset_version=17,
        input_names=[input_name],
        output_names=["out"],
        dynamic_axes={input_name: axes, "out": axes},  # both models keep the symbolic axes in place
    )
    return path


@pytest.fixture(scope="session")
def tiny_cnn_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Input `pixels` [batch, 1, 8, 8] -> `out` [batch, 10]."""
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny_cnn") / "cnn.onnx"
    return _export(TinyCnn(), torch.randn(2, 1, 8, 8), path, "pixels", {0: "batch"})


@pytest.fixture(scope="session")
def tiny_transformer_like_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Input `hidden` [batch, seq, 16] -> `out` [batch, seq, 16]."""
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny_transformer") / "attention.onnx"
    return _export(TinyAttention(), torch.randn(2, 5, 16), path, "hidden", {0: "batch", 1: "seq"})


@pytest.fixture(scope="session")
def tiny_multihead_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two-head attention, input `hidden` [batch, seq, 16] -> `out` [batch, seq, 16]."""
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny_multihead") / "multihead.onnx"
    return _export(TinyAttention(heads=2), torch.randn(2, 5, 16), path, "hidden", {0: "batch", 1: "seq"})


@pytest.fixture
def external_data_copy(tmp_path: Path) -> Callable[[Path], Path]:
    """Re-save a model in its own folder with every weight in a side file, as models past 2 GB are."""

    def copy(path: Path) -> Path:
        folder = tmp_path / "external"
        folder.mkdir(exist_ok=True)
        target = folder / path.name
        model = onnx.load(str(path))
        onnx.save_model(model, str(target), save_as_external_data=True, location=path.name + ".data", size_threshold=0)
        return target

    return copy


@pytest.fixture
def make_context(tmp_path: Path) -> Callable[[Batch], StepContext]:
    """A StepContext whose real batch (and only calibration batch) is `sample`."""

    def make(sample: Batch) -> StepContext:
        scratch = tmp_path / "scratch"
        scratch.mkdir(exist_ok=True)
        return StepContext(inputs=[], calibration=lambda: [sample], sample=lambda: sample, scratch=scratch)

    return make

