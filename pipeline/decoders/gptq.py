"""GPTQ's column loop for ONNX Runtime's vendored Intel Neural Compressor GPTQ, with its error propagation fixed.

ONNX Runtime 1.32's `neural_compressor.weight_only.gptq` holds the weight as [in, out] and the inverse Hessian's
upper Cholesky factor U, but pushes each row's rounding error onto the rows not yet quantized through U's
*column* (`Hinv1[i:, i]`, zero below the diagonal) instead of its *row* (`U[i, i:]`, as the GPTQ paper's code
does): nothing moves, and what it returns is round-to-nearest on each group's min/max whatever the calibration
data (tests/pipeline/decoders/test_decoder_kquant_gptq.py holds ONNX Runtime's own function to that, so the day it
is fixed upstream the test says this module can go). `swapped_in` puts this loop in ONNX Runtime's place while
GPTQ runs; ONNX Runtime still gathers the Hessians (prefill calls on the calibration windows) and writes
MatMulNBits, re-deriving each group's scale from the loop's values, which costs a little of the gain when a group's
updated values no longer reach both ends of its grid.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np


def _grid(weight: np.ndarray, maxq: int, scheme: str) -> tuple[np.ndarray, np.ndarray]:
    """Per output channel scale and zero point of a group of rows (its range widened to hold 0), as ORT's own."""
    low = np.minimum(weight.min(axis=0), 0)
    high = np.maximum(weight.max(axis=0), 0)
    if scheme == "sym":
        high = np.maximum(np.abs(low), high)
        low = np.where(low < 0, -high, low)
    flat = (low == 0) & (high == 0)
    low, high = np.where(flat, -1, low), np.where(flat, 1, high)
    scale = (high - low) / maxq
    zero = np.full_like(scale, (maxq + 1) / 2) if scheme == "sym" else np.round(-low / scale)
    return scale, zero


def gptq(W: np.ndarray, H: np.ndarray, num_bits: int = 4, group_size: int = 32, scheme: str = "asym",  # noqa: N803
         blocksize: int = 128, percdamp: float = 0.01, actorder: bool = False, mse: bool = False,
         perchannel: bool = True) -> np.ndarray:
    """The fake-quantized weight [in, out] (ORT's signature; its `mse` and per-tensor options are not used)."""
    if mse or not perchannel or actorder:
        raise ValueError("temper's GPTQ loop takes ONNX Runtime's defaults only (no mse, actorder, per-tensor)")
    maxq = 2**num_bits - 1
    rows = W.shape[0]
    group = group_size if group_size != -1 else rows
    W = W.astype(np.float64)  # noqa: N806
    H = H.astype(np.float64)  # noqa: N806
    dead = np.diag(H) == 0
    H[dead, dead] = 1
    W[dead, :] = 0
    H[np.arange(rows), np.arange(rows)] += percdamp * np.mean(np.diag(H))
    upper = np.linalg.cholesky(np.linalg.inv(H)).T  # inv(H) = upper.T @ upper
    Q = np.zeros_like(W)  # noqa: N806
    for i1 in range(0, rows, blocksize):
        i2 = min(i1 + blocksize, rows)
        block, errors, u = W[i1:i2].copy(), np.zeros((i2 - i1, W.shape[1])), upper[i1:i2, i1:i2]
        scale, zero = _grid(block[:group], maxq, scheme)  # replaced at the first row of each group
        for i in range(i2 - i1):
            if (i1 + i) % group == 0:  # the group's rows as the errors so far left them
                rows_now = block[i:i + group]
                if len(rows_now) < group:
                    rows_now = np.concatenate([rows_now, W[i2:i2 + group - len(rows_now)]])
                scale, zero = _grid(rows_now, maxq, scheme)
            w = block[i]
            q = scale * (np.clip(np.round(w / scale) + zero, 0, maxq) - zero)
            Q[i1 + i] = q
            errors[i] = (w - q) / u[i, i]
            block[i:] -= np.outer(u[i, i:], errors[i])
        W[i2:] -= upper[i1:i2, i2:].T @ errors
    return Q.astype(np.float32)


@contextlib.contextmanager
def swapped_in() -> Iterator[None]:
    """ONNX Runtime's `gptq_quantize` calling this module's loop instead of its own, for the `with` block."""
    from onnxruntime.quantization.neural_compressor import weight_only

    own = weight_only.gptq
    weight_only.gptq = gptq
    try:
        yield
    finally:
        weight_only.gptq = own
