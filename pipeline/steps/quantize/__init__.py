"""The quantize step and everything only it uses.

- `quantize.py` — the `Quantize` step: options checks, the backend's pre-flight, the run through the backend
  registry (pipeline/quantize_backends/: ONNX Runtime's quantizer, ModelOpt, NNCF), the output check.
- `census_check.py` — a step that quantized nothing fails; what `temper check` says of compute in subgraphs.
- `sensitivity.py` — the SQNR ranking of quantized nodes (ONNX Runtime's `qdq_loss_debug`).
- `fallback.py` — the accuracy-aware trial loop behind the `fallback` option.
"""

from __future__ import annotations

from temper.pipeline.steps.quantize.quantize import Quantize, calibration_feeds, needs_external_data, rankable

__all__ = ["Quantize", "calibration_feeds", "needs_external_data", "rankable"]
