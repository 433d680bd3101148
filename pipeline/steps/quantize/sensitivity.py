"""Which quantized nodes hurt most: SQNR of every quantized tensor on calibration data.

Built on ONNX Runtime's qdq_loss_debug: both the float and a QDQ model get every tensor added as
an output; the QDQ model shows each activation before and after its Q/DQ pair. A node's score is
the worst signal-to-quantization-noise ratio (dB) among the tensors it reads or writes that were
quantized, weights included: low means the INT8 grid cannot hold that tensor (outliers, a -inf
attention mask in the range).

Memory stays bounded whatever the model and sample count: the tensors are read a chunk at a time
(tensor_probe: a cut-down model per chunk, about `chunk_bytes` of activations for one run of a few
rows), every run goes through each chunk and is reduced to signal and noise energy sums at once, in float64
slices. Reading everything in one run held every activation of a batch (MiniLM: 17.9 GiB).
The chunks walk the graph (tensor_probe.Walk): each node runs once per batch and model, the tensors
that cross from one chunk's nodes to the next kept in between.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnxruntime.quantization import qdq_loss_debug as debug

from temper.artifacts.core.onnx_io import Batch
from temper.pipeline.quantize_backends import quantize_static
from temper.pipeline.quantize_backends.ort import OrtOptions
from temper.pipeline.steps.tensor_probe import Probe, named_dims, saved_tensors

# PyTorch names repeated modules `layer.3`, `blocks.2`: the block is the path up to that index.
_BLOCK = re.compile(r"^(.*?/[A-Za-z_]+\.\d+)/")

# Activations of one run held at once, both models together. Runs are a few rows each (in_calls),
# so a chunk holds more activations: MiniLM's 64 ranking samples took 10 chunks of 1 GiB in runs of
# 32 rows (3.7 GiB resident), and far fewer passes over the graph in runs of 8.
CHUNK_BYTES = 2**28


@dataclass(frozen=True)
class NodeSensitivity:
    node: str
    op_type: str
    block: str
    sqnr_db: float  # worst SQNR among the quantized tensors the node touches (lower = worse)
    accumulated_db: float | None  # SQNR of its output against the float model's (error so far), if measured

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def rank(prepared: quantize_static.Prepared, options: OrtOptions, feeds: list[Batch],
         scratch: Path, *, progress: Callable[[str], None] | None = None,
         chunk_bytes: int = CHUNK_BYTES) -> list[NodeSensitivity]:
    """The quantized nodes of `prepared.model`, most harmful first. `progress` hears how many
    activations are measured so far; `chunk_bytes` bounds the activations held at once."""
    qdq = scratch / "sensitivity-qdq.onnx"
    quantize_static.write(prepared, qdq, options.model_copy(update={"format": "qdq"}), [])
    local, accumulated = _Ratio(), _Ratio()
    runs = list(quantize_static.in_calls(prepared.model, feeds, split=True))  # energies add up over rows
    for note in _measure(prepared.model, qdq, runs, chunk_bytes, local, accumulated):
        if progress is not None:
            progress(note)
    tensors = local.db()
    # Scalars (GELU's 0.5, shared by every layer) are not weights that can hurt: their matching is
    # unreliable and one bad reading would tie every node that reads them.
    weights = {name: _sqnr(*_energies([m["float"]], [m["dequantized"]]))
               for name, m in debug.create_weight_matching(str(prepared.model), str(qdq)).items()
               if np.size(m["float"]) > 1}
    return _nodes(prepared.structure, tensors | weights, accumulated.db())



def _measure(float_model: Path, qdq_model: Path, feeds: list[Batch], chunk_bytes: int, local: _Ratio,
             accumulated: _Ratio) -> Iterator[str]:
    """Add each activation's QDQ error (before vs after its Q/DQ pair) to `local` and its error against
    the float model to `accumulated`, a chunk of activations at a time; yields progress per batch.

    The pairing is qdq_loss_debug's own (create_activation_matching), applied to names. A chunk holds
    about `chunk_bytes` by the shapes shape inference gives; an activation of unknown size counts as
    the largest one read so far, and goes alone while none was read."""
    qdq_saved, float_saved = saved_tensors(qdq_model), saved_tensors(float_model)
    matched = debug.create_activation_matching({t: t for t in qdq_saved}, {t: t for t in float_saved})
    pairs = [(name, m["pre_qdq"], m["post_qdq"], m.get("float")) for name, m in matched.items()]
    named = named_dims(float_model, feeds)

    def estimate(pre: str, post: str, reference: str | None) -> int | None:
        sizes = [qdq_saved[pre].nbytes(named), qdq_saved[post].nbytes(named),
                 float_saved[reference].nbytes(named) if reference else 0]
        return None if None in sizes else sum(s for s in sizes if s is not None)

    qdq_walk = Probe(qdq_model, qdq_saved).walk(feeds, {t for _, pre, post, _ in pairs for t in (pre, post)})
    float_walk = Probe(float_model, float_saved).walk(feeds, {f for *_, f in pairs if f is not None})
    done, largest = 0, 0
    while done < len(pairs):
        chunk: list[tuple[str, str, str, str | None]] = []
        held = 0
        for pair in pairs[done:]:
            known = estimate(*pair[1:])
            if known is None and not largest:  # unknown size, nothing read yet: alone
                chunk = chunk or [pair]
                break
            size = largest if known is None else known
            if chunk and held + size > chunk_bytes:
                break
            chunk.append(pair)
            held += size
        floats = [f for *_, f in chunk if f is not None]
        qdq_reads = qdq_walk.read([t for _, pre, post, _ in chunk for t in (pre, post)])
        float_reads = float_walk.read(floats) if floats else iter([{}] * len(feeds))
        for batch, (q, f) in enumerate(zip(qdq_reads, float_reads, strict=True), 1):
            for name, pre, post, reference in chunk:
                local.add(name, [q[pre]], [q[post]])
                if reference is not None:
                    accumulated.add(name, [f[reference]], [q[post]])
                largest = max(largest, q[pre].nbytes + q[post].nbytes + (f[reference].nbytes if reference else 0))
            del q, f  # before the next batch's run, so one batch of the chunk is held at a time
            yield f"sensitivity: {done}/{len(pairs)} activations measured, chunk of {len(chunk)}: " \
                  f"batch {batch}/{len(feeds)}"
        done += len(chunk)


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
    (a quantized attention mask turns scores into NaN, which a later Where quietly zeroes). Summed in
    float64 a slice at a time: a whole copy of a BERT attention tensor in float64 is gigabytes."""
    signal, noise = 0.0, 0.0
    for ref, out in zip(reference, test, strict=True):
        ref, out = np.ravel(ref), np.ravel(out)
        for start in range(0, ref.size, SLICE):
            a, b = ref[start:start + SLICE].astype(np.float64), out[start:start + SLICE].astype(np.float64)
            finite = np.isfinite(a)
            finite &= np.isfinite(b)
            if not finite.all():
                if np.any(~finite & ~(a == b)):
                    noise = float("inf")
                a, b = a[finite], b[finite]
            signal += float(np.dot(a, a))
            b -= a
            noise += float(np.dot(b, b))
    return signal, noise


SLICE = 1 << 20  # elements per float64 slice (8 MiB per operand)
NOISELESS_DB = 200.0  # a tensor the INT8 grid reproduces exactly (all zeros, a constant)
BROKEN_DB = -200.0  # NaN/Inf where the float model has numbers


def _sqnr(signal: float, noise: float) -> float:
    if noise == 0.0:
        return NOISELESS_DB
    if noise == float("inf"):
        return BROKEN_DB
    return float(np.clip(10 * np.log10(max(signal, 1e-300) / noise), BROKEN_DB, NOISELESS_DB))
