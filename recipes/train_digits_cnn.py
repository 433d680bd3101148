"""Trains DigitsCNN on the digits training split and writes digits_cnn.pt (checked in).

Deterministic: fixed seeds, one thread, deterministic algorithms. Run: python recipes/train_digits_cnn.py
"""

from __future__ import annotations

import torch
from digits_data import test, train
from digits_model import CHECKPOINT, DigitsCNN
from torch import nn


def main(epochs: int = 30) -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    data = train()
    x, y = torch.from_numpy(data["pixels"]), torch.from_numpy(data["label"])
    model = DigitsCNN()
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    loss_fn = nn.CrossEntropyLoss()
    order = torch.Generator().manual_seed(0)
    for _ in range(epochs):
        model.train()
        for idx in torch.randperm(len(x), generator=order).split(64):
            optimizer.zero_grad()
            loss_fn(model(x[idx]), y[idx]).backward()
            optimizer.step()
    model.eval()
    held_out = test()
    with torch.no_grad():
        predicted = model(torch.from_numpy(held_out["pixels"])).argmax(1).numpy()
    print(f"held-out top-1: {(predicted == held_out['label']).mean():.4f}")
    torch.save(model.state_dict(), CHECKPOINT)


if __name__ == "__main__":
    main()
