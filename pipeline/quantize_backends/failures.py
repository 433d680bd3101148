"""A quantizer library's failure as one line: the stage that failed, the node it was at, and the way out.

ONNX Runtime's tools raise bare errors: symbolic shape inference an `AssertionError` with no text, the
dynamic quantizer "Expected _v_1137 to be an initializer" (a tensor, not the node reading it). The node
is the one the library was handling when it raised: the innermost frame of the traceback holding an ONNX
node (a local `node`, or `self.node` in ORT's per-op quantizers), inside an If/Loop body too.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from types import TracebackType

import onnx

from temper.artifacts.core.errors import OptionError, StepFailed, TemperError, first_line

PREPROCESS_OFF = ("set preprocess: false on this quantize step to quantize the graph as it is (the cost: no fused "
                  "ops and no inferred shapes, so tensors of unknown shape stay float and the INT8 model is often "
                  "slower)")
# The tools a stage calls into, by the file they live in: which part of quant_pre_process (or of a quantizer's
# own shape inference) raised.
_PARTS = {"symbolic_shape_infer": "symbolic shape inference", "onnx/shape_inference": "ONNX shape inference"}


def node_at_fault(tb: TracebackType | None) -> onnx.NodeProto | None:
    """The ONNX node the innermost frame of `tb` that holds one was working on."""
    found = None
    while tb is not None:
        local = tb.tb_frame.f_locals
        node = local.get("node") if "node" in local else getattr(local.get("self"), "node", None)
        if isinstance(node, onnx.NodeProto):
            found = node
        tb = tb.tb_next
    return found


def _part(tb: TracebackType | None) -> str:
    while tb is not None:
        path = tb.tb_frame.f_code.co_filename.replace("\\", "/")
        part = next((name for key, name in _PARTS.items() if key in path), None)
        if part:
            return f" ({part})"
        tb = tb.tb_next
    return ""


def user_name(node: onnx.NodeProto) -> str:
    """The node's name as the step's input graph has it: quant_pre_process's fusions rename the node that
    survives `<name>/<Kind>Fusion`, and exclude_nodes takes input-graph names (pre_process.follow_fusions)."""
    head, _, tail = node.name.rpartition("/")
    return head if head and tail.endswith("Fusion") else node.name


def keep_float(preprocessed: bool) -> Callable[[onnx.NodeProto | None], str]:
    """The way out of a quantizer failing at one node: keep that node float (it then runs in FP32); a graph
    quantized as it is may also need pre-processing, which folds Constant and shape nodes into initializers."""
    def hint(node: onnx.NodeProto | None) -> str:
        if node is None:  # not at a node (the data, the environment): nothing to keep float
            way = "`temper --debug` shows the library's traceback"
        elif node.name:
            way = f"keep this node float with exclude_nodes: [{user_name(node)}] (it then runs in FP32)"
        else:
            way = f"keep {node.op_type} float with exclude_op_types: [{node.op_type}] (those nodes then run in FP32)"
        if not preprocessed:
            way += ("; or set preprocess: true, which folds Constant and shape nodes into the initializers the "
                    "quantizer needs")
        return way

    return hint


@contextlib.contextmanager
def stage(name: str, way_out: Callable[[onnx.NodeProto | None], str]) -> Iterator[None]:
    """Run one stage of a quantizer; a library exception becomes StepFailed: the stage, the node, `way_out(node)`.
    temper's own errors pass through with their exit codes."""
    try:
        yield
    except (TemperError, OptionError):
        raise
    except Exception as err:
        node = node_at_fault(err.__traceback__)
        at = "" if node is None else f" at {node.op_type} node '{node.name or ', '.join(node.output)}'"
        raise StepFailed(f"quantize: {name}{_part(err.__traceback__)} failed{at}: {first_line(err).rstrip('.')}; "
                         f"{way_out(node)}") from err
