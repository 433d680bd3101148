"""Which quantized nodes hurt most: SQNR of every quantized tensor on calibration data.

Built on ONNX Runtime's qdq_loss_debug: both the float and a QDQ model get every tensor added as
an output; the QDQ model shows each activation before and after its Q/DQ pair. A node's score is
the worst signal-to-quantization-noise ratio (dB) among the tensors it reads or writes that were
quantized, weights included: low means the INT8 grid cannot hold that tensor (outliers, a -inf
attention mask in the range). Batches are reduced one at a time, so memory stays at one batch of
activations whatever the sample count.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnxruntime.quantization import qdq_loss_debug as debug

from temper.pipeline.onnx_io import Batch
from temper.pipeline.step_options import QuantizeOptions
from temper.pipeline.steps.quantize import quantize_static

# PyTorch names repeated modules `layer.3`, `blocks.2`: the block is the path up to that index.
_BLOCK = re.compile(r"^(.*?/[A-Za-z_]+\.\d+)/")


@dataclass(frozen=True)
class NodeSensitivity:
    node: str
    op_type: str
    block: str
    sqnr_db: float  # worst SQNR among the quantized tensors the node touches (lower = worse)
    accumulated_db: float | None  # SQNR of its output against the float model's (error so far), if measured

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def rank(prepared: quantize_static.Prepared, options: QuantizeOptions, feeds: list[Batch],
         scratch: Path) -> list[NodeSensitivity]:
    """The quantized nodes of `prepared.model`, most harmful first."""
    qdq = scratch / "sensitivity-qdq.onnx"
    quantize_static.write(prepared, qdq, options.model_copy(update={"format": "qdq"}), [])
    float_aug, qdq_aug = scratch / "sensitivity-float.onnx", scratch / "sensitivity-qdq-aug.onnx"
    debug.modify_model_output_intermediate_tensors(str(prepared.model), str(float_aug),
                                                   save_as_external_data=prepared.large)
    debug.modify_model_output_intermediate_tensors(str(qdq), str(qdq_aug), save_as_external_data=prepared.large)
    local, accumulated = _Ratio(), _Ratio()
    for feed in feeds:
        matched = debug.create_activation_matching(debug.collect_activations(str(qdq_aug), iter([feed])),
                                                   debug.collect_activations(str(float_aug), iter([feed])))
        for tensor, pair in matched.items():
            local.add(tensor, pair["pre_qdq"], pair["post_qdq"])
            if pair.get("float"):
                accumulated.add(tensor, pair["float"], pair["post_qdq"])
    tensors = local.db()
    # Scalars (GELU's 0.5, shared by every layer) are not weights that can hurt: their matching is
    # unreliable and one bad reading would tie every node that reads them.
    weights = {name: _sqnr(*_energies([m["float"]], [m["dequantized"]]))
               for name, m in debug.create_weight_matching(str(prepared.model), str(qdq)).items()
               if np.size(m["float"]) > 1}
    return _nodes(prepared.structure, tensors | weights, accumulated.db())


def block_of(node: str) -> str:
    """The repeated module a node belongs to (`/encoder/layer.3`), else its parent path."""
    match = _BLOCK.match(node)
    return match.group(1) if match else node.rpartition("/")[0]


def _nodes(model: onnx.ModelProto, tensor_db: dict[str, float], accumulated: dict[str, float]) -> list[NodeSensitivity]:
    found = []
    for order, node in enumerate(model.graph.node):
        touched = [tensor_db[t] for t in (*node.input, *node.output) if t in tensor_db]
        if not touched or not node.name:
            continue
        output_db = min((accumulated[t] for t in node.output if t in accumulated), default=None)
        found.append((min(touched), NOISELESS_DB if output_db is None else output_db, order, NodeSensitivity(
            node.name, node.op_type, block_of(node.name), round(min(touched), 2),
            None if output_db is None else round(output_db, 2))))
    return [entry[-1] for entry in sorted(found, key=lambda e: e[:3])]


class _Ratio:
    """Signal and noise energy per tensor, summed over batches (float64: attention masks hold -3.4e38)."""

    def __init__(self) -> None:
        self.signal: dict[str, float] = defaultdict(float)
        self.noise: dict[str, float] = defaultdict(float)

    def add(self, tensor: str, reference: list[np.ndarray], test: list[np.ndarray]) -> None:
        signal, noise = _energies(reference, test)
        self.signal[tensor] += signal
        self.noise[tensor] += noise

    def db(self) -> dict[str, float]:
        return {t: _sqnr(self.signal[t], self.noise[t]) for t in self.signal}


def _energies(reference: list[np.ndarray], test: list[np.ndarray]) -> tuple[float, float]:
    """Signal and noise energy; a NaN/Inf where the reference has a different value is infinite noise
    (a quantized attention mask turns scores into NaN, which a later Where quietly zeroes)."""
    a = np.concatenate([np.ravel(x) for x in reference]).astype(np.float64)
    b = np.concatenate([np.ravel(x) for x in test]).astype(np.float64)
    finite = np.isfinite(a) & np.isfinite(b)
    if np.any(~finite & ~(a == b)):
        return float(np.dot(a[finite], a[finite])), float("inf")
    a, b = a[finite], b[finite]
    return float(np.dot(a, a)), float(np.dot(a - b, a - b))


NOISELESS_DB = 200.0  # a tensor the INT8 grid reproduces exactly (all zeros, a constant)
BROKEN_DB = -200.0  # NaN/Inf where the float model has numbers


def _sqnr(signal: float, noise: float) -> float:
    if noise == 0.0:
        return NOISELESS_DB
    if noise == float("inf"):
        return BROKEN_DB
    return float(np.clip(10 * np.log10(max(signal, 1e-300) / noise), BROKEN_DB, NOISELESS_DB))
