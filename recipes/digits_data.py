"""scikit-learn's bundled digits (1,797 real 8x8 scans), split once with a fixed seed so training,
calibration and evaluation never overlap."""

from __future__ import annotations

import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split


def _split() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    digits = load_digits()
    pixels = (digits.images / 16.0).astype(np.float32)[:, None, :, :]  # [n, 1, 8, 8] in [0, 1]
    return train_test_split(pixels, digits.target.astype(np.int64), test_size=0.3, random_state=0,
                            stratify=digits.target)


def train() -> dict[str, np.ndarray]:
    """The training split: used to train the CNN and, as unlabelled images, to calibrate INT8."""
    x, _, y, _ = _split()
    return {"pixels": x, "label": y}


def test() -> dict[str, np.ndarray]:
    """The held-out split (540 images): evaluation only."""
    _, x, _, y = _split()
    return {"pixels": x, "label": y}
