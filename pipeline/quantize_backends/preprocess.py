"""ONNX Runtime's quant_pre_process, which both INT8 paths run first (unless `preprocess: false`), and
the node renames it makes.

Symbolic shape inference gives the quantizer each tensor's shape (a tensor of unknown shape stays float);
ORT's basic optimizations fold constants and fuse (MatMul + Add -> Gemm, Conv + BatchNorm), so Q/DQ pairs
go around the fused op rather than between its parts. Folding also turns weights made by Constant or
shape nodes into the initializers both quantizers need: without it the dynamic one raises "Expected ...
to be an initializer" (a real OCR model did, and quantized after pre-processing).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import onnx
from onnxruntime.quantization.shape_inference import quant_pre_process

from temper.artifacts.core.errors import OptionError
from temper.pipeline.quantize_backends import failures


def pre_process(src: Path, scratch: Path, large: bool) -> Path:
    """The pre-processed model, written in `scratch`; StepFailed naming the stage and node when it fails."""
    pre = scratch / "preprocessed.onnx"
    # auto_merge: symbolic shape inference otherwise stops at BERT-style attention reshapes
    # ("Incomplete symbolic shape inference" on MiniLM); merging equal symbolic dims is safe here.
    # chdir: when shape inference gives up it saves a debug model into the working folder.
    with failures.stage("quant_pre_process", lambda _: failures.PREPROCESS_OFF), contextlib.chdir(scratch):
        quant_pre_process(str(src.resolve()), str(pre.resolve()), auto_merge=True, save_as_external_data=large)
    return pre


def follow_fusions(model: onnx.ModelProto, named: list[str], typed: list[str]) -> list[str]:
    """Map node names of the input graph onto the pre-processed one.

    quant_pre_process runs ONNX Runtime's basic fusions: the surviving node is renamed
    `<name>/<Fusion>` (MatMul `fc` + Add -> Gemm `fc/MatMulAddFusion`) and absorbed nodes
    vanish. A named node that vanished cannot stay float on its own, so we say so.
    """
    present = [node.name for node in model.graph.node]

    def follow(name: str) -> list[str]:
        return [name] if name in present else [p for p in present if p.startswith(name + "/")]

    keep: list[str] = []
    for index, name in enumerate(named):
        found = follow(name)
        if not found:
            raise OptionError(
                f"exclude_nodes[{index}]",
                f"node '{name}' is merged into a neighbour by quant_pre_process (ONNX Runtime's basic fusions), "
                "so it cannot stay float on its own; exclude the node it merges into",
            )
        keep += found
    for name in typed:
        keep += follow(name)
    return sorted(set(keep))
