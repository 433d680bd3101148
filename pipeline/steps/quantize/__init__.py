"""The quantize step and everything only it uses.

- `quantize.py` — the `Quantize` step: options checks, the backend switch, the output check.
- `quantize_dynamic.py`, `quantize_static.py` — ONNX Runtime's two INT8 paths; `quantize_modelopt.py`
  NVIDIA ModelOpt's and `quantize_nncf.py` Intel NNCF's (optional extras).
- `sensitivity.py` — the SQNR ranking of quantized nodes (ONNX Runtime's `qdq_loss_debug`).
- `fallback.py` — the accuracy-aware trial loop behind the `fallback` option.
"""

from __future__ import annotations

from temper.pipeline.steps.quantize.quantize import Quantize, calibration_feeds, needs_external_data, rankable

__all__ = ["Quantize", "calibration_feeds", "needs_external_data", "rankable"]
