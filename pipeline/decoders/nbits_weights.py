"""A `matmul-nbits` decoder candidate: ONNX Runtime's MatMulNBitsQuantizer writing each weight MatMul as
MatMulNBits, by its own RTN (the DEFAULT config), HQQ, or the k-quant and GPTQ it vendors from Intel Neural
Compressor (`onnxruntime.quantization.neural_compressor.weight_only`, no INC install needed).

k-quant is llama.cpp's search for each block's scale and minimum (weighted by magnitude, no data); GPTQ quantizes
input channel by input channel, pushing each one's error onto those not yet quantized through the inverse Hessian
of the layer's inputs, which it gathers from prefill calls on the recipe's held-out windows (ONNX Runtime 1.32's
own loop propagates nothing: temper's loop in gptq.py runs in its place).

Both go through INC's per-node `weight_config`, which ONNX Runtime 1.32 builds at 4 bits whatever `bits` says and
without the excluded nodes for GPTQ (only RTN and k-quant mark them "fp32", the skip marker both INC functions
read): `_PerNode` writes that config from the quantizer's own bits and exclusions, so `bits: 8` (k-quant) and
`keep_float` (both) hold. GPTQ writes MatMulNBits at 4 bits only (at 8 it leaves fake-quantized float weights):
the recipe refuses gptq with bits 8.
"""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from onnxruntime.quantization import CalibrationDataReader
from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

from temper.pipeline.decoders.spec import WeightOptions


class _Windows(CalibrationDataReader):
    """GPTQ's calibration reader: the prefill feeds in order (ONNX Runtime deep-copies it, cursor and all, before
    reading)."""

    def __init__(self, feeds: list[dict[str, np.ndarray]]) -> None:
        self.feeds = iter(feeds)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self.feeds, None)


class _PerNode(MatMulNBitsQuantizer):
    """INC's per-node config at the quantizer's bits, the excluded nodes marked "fp32" (see the module)."""

    def _generate_q4_node_config(self) -> dict[str, Any]:
        config = super()._generate_q4_node_config()
        return {n: "fp32" if n in self.nodes_to_exclude else {**c, "bits": self.bits} for n, c in config.items()}


def _odd_blocks(model: Any, kept: list[str], block: int) -> str | None:
    """The first weight MatMul whose input channels make an odd number of blocks: INC packs two 4-bit zero points
    a byte per output channel and cannot split the last byte (it fails with a bare numpy reshape error)."""
    shapes = {t.name: list(t.dims) for t in model.graph.initializer}
    for node in model.graph.node:
        dims = shapes.get(node.input[1]) if node.op_type == "MatMul" and len(node.input) > 1 else None
        if dims and len(dims) == 2 and node.name not in kept and -(-dims[0] // block) % 2:
            return f"{node.name} has {dims[0]} input channels, {-(-dims[0] // block)} blocks of {block}"
    return None


def quantize(base: Path, name: str, options: WeightOptions, kept: list[str], out: Path,
             calibration: Sequence[Sequence[int]]) -> None:
    """`out/name`: the baseline's weight MatMuls as MatMulNBits, `options.algorithm`'s way, `kept` left float, each
    MatMulNBits at the recipe's `accuracy_level`."""
    import onnx
    from onnxruntime.quantization import matmul_nbits_quantizer as nbits

    algorithm, level = options.algorithm, options.accuracy_level
    config: Any
    if algorithm == "hqq":
        config = nbits.HQQWeightOnlyQuantConfig(block_size=options.block_size, bits=options.bits)
    elif algorithm == "k_quant":
        config = nbits.KQuantWeightOnlyQuantConfig()
    elif algorithm == "gptq":
        if not calibration:
            raise ValueError("gptq calibrates: give it token windows (the recipe's data.calibration_sequences)")
        from temper.pipeline.decoders.calibration import prefill_feeds
        from temper.pipeline.decoders.gptq import swapped_in

        config = nbits.GPTQWeightOnlyQuantConfig(calibration_data_reader=_Windows(prefill_feeds(base, calibration)))
    else:
        config = nbits.DefaultWeightOnlyQuantConfig(block_size=options.block_size, is_symmetric=options.symmetric,
                                                    accuracy_level=level or None, bits=options.bits)
    model = onnx.load(str(base / name))
    odd = _odd_blocks(model, kept, options.block_size) if algorithm in ("k_quant", "gptq") else None
    if odd and options.bits == 4:
        raise ValueError(f"{algorithm} at 4 bits needs an even number of blocks per weight column (ONNX Runtime's "
                         f"zero-point packing): {odd}")
    quantizer = _PerNode(
        model, bits=options.bits, block_size=options.block_size,
        is_symmetric=options.symmetric, accuracy_level=level or None, nodes_to_exclude=kept, algo_config=config)
    logging.getLogger("neural_compressor").setLevel(logging.ERROR)  # k-quant's note that it runs on the CPU
    fixed = swapped_in() if algorithm == "gptq" else contextlib.nullcontext()
    with fixed, contextlib.redirect_stdout(io.StringIO()):  # INC prints a progress bar per MatMul
        quantizer.process()
    model = quantizer.model.model
    for node in model.graph.node:  # HQQ does not set it: every MatMulNBits gets the recipe's compute type
        if node.op_type == "MatMulNBits" and level:
            others = [a for a in node.attribute if a.name != "accuracy_level"]
            del node.attribute[:]
            node.attribute.extend([*others, onnx.helper.make_attribute("accuracy_level", level)])
    onnx.save_model(model, str(out / name), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=f"{name}.data", size_threshold=1024)
