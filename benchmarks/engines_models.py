"""The resnet18 of benchmarks/engines.py, with random weights, and its random images.

torchvision does not import on the benchmark host, so the network is written out here (the
torchvision layout: BasicBlock x [2, 2, 2, 2], 1000 classes). Weights come from torch's default
initialisation under a fixed seed: **random weights**, so the figures say nothing about accuracy, only
fidelity to the FP32 model and speed. The batch-norm statistics are set by a few training-mode passes
over the same random images, so activations have realistic ranges for INT8 calibration.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

SIZE = 224


class BasicBlock(nn.Module):
    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.downsample: nn.Module | None = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + identity)


class ResNet18(nn.Module):
    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        layers, inplanes = [], 64
        for planes, stride in [(64, 1), (128, 2), (256, 2), (512, 2)]:
            layers.append(nn.Sequential(BasicBlock(inplanes, planes, stride), BasicBlock(planes, planes)))
            inplanes = planes
        self.layers = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, classes)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(image))))
        return self.fc(torch.flatten(self.avgpool(self.layers(x)), 1))


def _images(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 3, SIZE, SIZE), dtype=np.float32)


def build() -> nn.Module:
    """resnet18 with random weights (seed 0), batch-norm statistics from 4 batches of random images."""
    torch.manual_seed(0)
    model = ResNet18()
    model.train()
    with torch.no_grad():
        for i in range(4):
            model(torch.from_numpy(_images(16, 100 + i)))
    return model.eval()


def calibration() -> dict[str, np.ndarray]:
    return {"image": _images(64, 1)}


def evaluation() -> dict[str, np.ndarray]:
    return {"image": _images(64, 2)}
