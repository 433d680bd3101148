"""Entropy calibration's threshold search, the same arithmetic as ONNX Runtime's, vectorized.

`HistogramCollector.get_entropy_threshold` tries every symmetric window of the histogram (961 of them
for the default 2048 bins and 128 quantized bins) and sums bins with Python's `sum` over numpy
elements, one bin at a time: 11 of a digits CNN's 37 s `temper run`. Here the outlier counts come from
one cumulative sum and the merged bins from a reshape, which for the integer counts a histogram holds
are the same integers; the smoothing and the KL divergence are ONNX Runtime's own functions. So the
thresholds are ONNX Runtime's, bit for bit (tests/pipeline/steps/test_entropy.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from onnxruntime.quantization.calibrate import CalibrationMethod, HistogramCollector, TensorsData, entropy
from onnxruntime.quantization.quant_utils import smooth_distribution


def thresholds(collector: HistogramCollector) -> TensorsData:
    """What `collector.compute_collection_result()` returns for the entropy method, as TensorsData."""
    found = {}
    for tensor, histogram in collector.histogram_dict.items():
        if np.issubdtype(np.asarray(histogram[0]).dtype, np.integer):
            window = threshold(histogram, collector.num_quantized_bins)
        else:  # sums of fractional counts depend on their order: the library's own loop
            window = collector.get_entropy_threshold(histogram, collector.num_quantized_bins)
        found[tensor] = (*window, *histogram[:2])
    return TensorsData(CalibrationMethod.Entropy, found)


def threshold(histogram: Any, num_quantized_bins: int) -> tuple[np.ndarray, np.ndarray]:
    """HistogramCollector.get_entropy_threshold for a histogram of integer counts."""
    hist, edges, lowest, highest = histogram[0], histogram[1], histogram[2], histogram[3]
    size = hist.size
    zero = size // 2
    half = num_quantized_bins // 2
    dtype = edges.dtype
    before = np.concatenate([np.zeros(1, dtype=hist.dtype), np.cumsum(hist)])  # before[k] = sum(hist[:k])
    divergence = np.zeros(zero - half + 1)
    windows = []
    for i in range(half, zero + 1):
        start, end = zero - i, min(zero + i + 1, size)
        windows.append((edges[start], edges[end]))
        sliced = hist[start:end]
        p = sliced.copy()
        p[0] += before[start]
        p[-1] += before[size] - before[end]
        merged = sliced.size // num_quantized_bins
        whole = num_quantized_bins * merged
        quantized = sliced[:whole].reshape(num_quantized_bins, merged).sum(axis=1).astype(np.int64)
        quantized[-1] += sliced[whole:].sum()
        norms = (p[:whole] != 0).reshape(num_quantized_bins, merged).sum(axis=1)
        q = np.zeros(p.size, dtype=np.int64)
        q[:whole] = np.repeat(np.where(norms != 0, quantized / np.maximum(norms, 1), 0), merged)
        p, q = smooth_distribution(p), smooth_distribution(q)
        divergence[i - half] = np.inf if p is None or q is None else np.array(entropy(p, q), dtype=dtype)
    low, high = windows[int(np.argmin(divergence))]
    return (lowest if low < lowest else low), (highest if high > highest else high)
