"""The quantize step and everything only it uses.

- `quantize.py` — the `Quantize` step: options checks, the backend switch, the output check.
- `quantize_dynamic.py`, `quantize_static.py` — ONNX Runtime's two INT8 paths, both after `preprocess.py`
  (quant_pre_process, unless `preprocess: false`); `quantize_modelopt.py` NVIDIA ModelOpt's and
  `quantize_nncf.py` Intel NNCF's (optional extras).
- `failures.py` — a library failure as one line: the stage, the node it was at, the way out.
- `census_check.py` — a step that quantized nothing fails; what `temper check` says of compute in subgraphs.
- `sensitivity.py` — the SQNR ranking of quantized nodes (ONNX Runtime's `qdq_loss_debug`).
- `fallback.py` — the accuracy-aware trial loop behind the `fallback` option.
"""

from __future__ import annotations

from temper.pipeline.steps.quantize.quantize import Quantize, calibration_feeds, needs_external_data, rankable

__all__ = ["Quantize", "calibration_feeds", "needs_external_data", "rankable"]
