"""What ONNX Runtime's CPU provider really runs: the census of the graph it optimizes a model into.

A QDQ graph says where INT8 is meant. ONNX Runtime fuses each DequantizeLinear -> op -> QuantizeLinear
group it has an INT8 kernel for into a QLinear*/*Integer op, and runs what is left as float on
dequantized values. The graph's census counts NNCF's transformer INT8 of MiniLM as 48 of 48 MatMuls
quantized; ONNX Runtime runs 42 of them in INT8, and each layer's attention-by-values MatMul, both of
its inputs dequantized, in float. A pair on ONNX Runtime reports both counts.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import onnx
import onnxruntime as ort

from temper.artifacts.engines.onnxruntime import SessionSettings
from temper.artifacts.engines.providers import CPU
from temper.validators.census import Census, census


def of_session(model: Path, settings: SessionSettings) -> Census:
    """The census of the graph ONNX Runtime's CPU provider builds from `model` with `settings` (its
    graph optimization level decides the fusions), Q/DQ left around a float op counted as float."""
    with tempfile.TemporaryDirectory(prefix="temper-optimized-") as scratch:
        optimized = Path(scratch) / "optimized.onnx"
        options = settings.options()
        options.optimized_model_filepath = str(optimized)
        # the weights go to a file beside it: a model over 2 GB cannot be written inline
        options.add_session_config_entry("session.optimized_model_external_initializers_file_name", "weights.data")
        options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
        ort.InferenceSession(str(model), options, providers=[CPU])
        return census(onnx.load(str(optimized), load_external_data=False), qdq=False)
