"""torchvision's resnet18 as a recipe factory, and the PyTorch ceiling benchmarks/gpu_check.py divides by.

The ceiling is what the same model does in PyTorch on the same device, FP32 and under BF16 autocast, so a
temper engine's figure says how much of the hardware it reaches. On CUDA it is timed with CUDA events
(the host's clock would time kernel launches, not kernels); on the CPU with time.perf_counter.
"""

from __future__ import annotations

import importlib
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

SEED = 0
ROUNDS = 3  # timed windows per figure: the median is kept, the spread recorded


def torchvision_error() -> str | None:
    """Why torchvision does not import here (PyPI's does not beside the pinned torch), or None."""
    try:
        importlib.import_module("torchvision")
    except Exception as exc:  # an ImportError, or a RuntimeError from its compiled ops against another torch
        return f"{type(exc).__name__}: {exc}".strip()
    return None


def resnet18() -> nn.Module:
    """The recipe's factory: torchvision's resnet18, random weights (seed 0), batch-norm statistics from four
    training-mode passes over random images, so activations have ranges worth calibrating INT8 on."""
    torchvision = importlib.import_module("torchvision")
    torch.manual_seed(SEED)
    model = torchvision.models.resnet18(weights=None)
    model.train()
    with torch.no_grad():
        for i in range(4):
            images = np.random.default_rng(100 + i).standard_normal((16, 3, 224, 224), dtype=np.float32)
            model(torch.from_numpy(images))
    return model.eval()


def digits() -> nn.Module:
    """The digits recipe's own factory (recipes/digits_model.py), its checked-in weights."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "recipes" / "digits_model.py"
    spec = importlib.util.spec_from_file_location("gpu_check_digits_model", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build()


FACTORIES: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...]]] = {
    "digits": (digits, (1, 8, 8)), "resnet18": (resnet18, (3, 224, 224))}


def ceiling(name: str, device: str, batches: list[int], seconds: float, warmup_s: float,
            threads: int | None = None) -> dict[str, Any]:
    """Samples/s of the model in PyTorch on `device`, FP32 and BF16 autocast, per batch size: the median of
    ROUNDS timed windows after `warmup_s` of untimed calls. `threads`: torch's intra-op threads, on the CPU
    those temper's selected session ran with, so both sides use the same cores (torch's default, every
    core with spinning OpenMP threads, collapses on a shared 2-core machine)."""
    if threads:
        torch.set_num_threads(threads)
    factory, shape = FACTORIES[name]
    model = factory().to(device).eval()
    figures: dict[str, dict[str, Any]] = {}
    for precision in ("fp32", "bf16-autocast"):
        figures[precision] = {}
        for batch in batches:
            x = torch.from_numpy(np.random.default_rng(SEED).standard_normal((batch, *shape), dtype=np.float32))
            figures[precision][str(batch)] = _timed(model, x.to(device), device, precision, seconds, warmup_s)
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return {"device": device, "timer": "cuda events" if device == "cuda" else "time.perf_counter",
            "torch": torch.__version__, "threads": torch.get_num_threads(), "rounds": ROUNDS, "figures": figures}


def _timed(model: nn.Module, x: torch.Tensor, device: str, precision: str, seconds: float,
           warmup_s: float) -> dict[str, Any]:
    autocast = torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=precision != "fp32")
    with torch.inference_mode(), autocast:
        began, calls = time.perf_counter(), 0
        while calls < 3 or time.perf_counter() - began < warmup_s:
            model(x)
            calls += 1
            if device == "cuda":
                torch.cuda.synchronize()
        per_call = (time.perf_counter() - began) / calls
        n = max(3, int(seconds / ROUNDS / per_call))
        rates = [x.shape[0] * n / _window(model, x, device, n) for _ in range(ROUNDS)]
    median = statistics.median(rates)
    return {"samples_per_s": median, "ms_per_batch": x.shape[0] / median * 1e3, "calls_per_round": n,
            "spread_pct": (max(rates) - min(rates)) / median * 100, "warmup_calls": calls}


def _window(model: nn.Module, x: torch.Tensor, device: str, n: int) -> float:
    """Seconds for n calls: CUDA events around them on the GPU, perf_counter on the CPU."""
    if device == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(n):
            model(x)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    began = time.perf_counter()
    for _ in range(n):
        model(x)
    return time.perf_counter() - began
