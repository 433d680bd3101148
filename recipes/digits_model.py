"""A small CNN for scikit-learn's 8x8 digits. `build()` is the recipe's factory: it loads the
checked-in checkpoint made by train_digits_cnn.py, so every run exports the same weights."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

CHECKPOINT = Path(__file__).with_name("digits_cnn.pt")


class DigitsCNN(nn.Module):
    """Two conv blocks and a linear head: big enough that INT8 and FP16 matter, trained in seconds."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(64, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(64 * 2 * 2, 128), nn.ReLU(), nn.Linear(128, 10))

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(pixels))


def build() -> nn.Module:
    model = DigitsCNN()
    model.load_state_dict(torch.load(CHECKPOINT, weights_only=True))
    return model.eval()
