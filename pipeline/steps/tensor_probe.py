"""Read a model's intermediate tensors a few at a time, so memory holds only those.

Making every tensor a graph output (ONNX Runtime's qdq_loss_debug, the fp16 step's finite check)
holds them all: a session keeps every graph output of a run alive until the run ends, requested
or not, so one batch through BERT holds every activation at once (17.9 GiB for MiniLM's fallback
ranking, 4.9 GiB for its fp16 check). A probe instead builds, per set of tensors, a model cut down
to the nodes those tensors need, with just them as outputs (flattened by a Reshape, as
qdq_loss_debug does, so that graph inputs can be read the same way); `chunks` groups tensors
into such sets by their size.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper
from onnxruntime.quantization.calibrate import CalibraterBase

from temper.artifacts.onnx_io import Batch

_SAVED = "_TemperProbeOutput"
_FLAT = "TemperProbeFlatShape"


@dataclass(frozen=True)
class Saved:
    """A tensor to read: its element type and its shape as shape inference left it (int, name or None)."""

    elem_type: int
    dims: tuple[int | str | None, ...] | None

    def nbytes(self, named: dict[str, int]) -> int | None:
        """Its size for a batch whose named dimensions (`batch`, `seq`) are `named`; None when unknown."""
        if self.dims is None or any(isinstance(d, str) and d not in named or d is None for d in self.dims):
            return None
        count = math.prod(named[d] if isinstance(d, str) else int(d or 0) for d in self.dims)  # None: returned above
        return count * np.dtype(helper.tensor_dtype_to_np_dtype(self.elem_type)).itemsize


def saved_tensors(path: Path) -> dict[str, Saved]:
    """The tensors qdq_loss_debug would save (float node inputs and outputs that are no initializer),
    in graph order."""
    calibrater = CalibraterBase(path, op_types_to_calibrate=[])
    chosen, value_infos = calibrater.select_tensors_to_calibrate(calibrater.model)
    ordered = dict.fromkeys(t for node in calibrater.model.graph.node for t in (*node.input, *node.output)
                            if t in chosen)
    return {t: Saved(value_infos[t].type.tensor_type.elem_type, dims_of(value_infos[t])) for t in ordered}


def named_dims(model: Path, feeds: list[Batch]) -> dict[str, int]:
    """The size each named input dimension takes in `feeds` (the largest, where batches differ)."""
    named: dict[str, int] = {}
    for spec in onnx.load(str(model), load_external_data=False).graph.input:
        for feed in feeds:
            if spec.name in feed:
                for dim, size in zip(dims_of(spec) or (), np.shape(feed[spec.name]), strict=False):
                    if isinstance(dim, str):
                        named[dim] = max(named.get(dim, 0), int(size))
    return named


def dims_of(info: onnx.ValueInfoProto) -> tuple[int | str | None, ...] | None:
    tensor = info.type.tensor_type
    if not tensor.HasField("shape"):
        return None
    return tuple(d.dim_value if d.HasField("dim_value") else d.dim_param or None for d in tensor.shape.dim)


class Probe:
    """One model (weights left on disk where they are external) whose chosen tensors can be read.

    `weights`: the folder its external data lives in, when not the model's own (a structure
    saved elsewhere, such as a shape-inferred copy). Nothing is written there: the cut models are
    loaded from memory and read their weights from that folder."""

    def __init__(self, path: Path, types: dict[str, Saved], weights: Path | None = None) -> None:
        self.path, self.types, self.weights = path, types, weights or path.parent
        self.model = onnx.load(str(path), load_external_data=False)
        graph = self.model.graph
        self.producer = {out: index for index, node in enumerate(graph.node) for out in node.output}

    def read(self, tensors: list[str], feeds: list[Batch]) -> Iterator[dict[str, np.ndarray]]:
        """For each feed, {tensor: flat array} of `tensors`; one session serves every feed."""
        session = self._session(tensors)
        names = [o.name[: -len(_SAVED)] for o in session.get_outputs()]
        for feed in feeds:
            yield dict(zip(names, session.run(None, feed), strict=True))

    def _session(self, tensors: list[str]) -> ort.InferenceSession:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # as collect_activations
        options.log_severity_level = 3
        options.enable_cpu_mem_arena = False  # a chunk's outputs go back to the OS when it is done
        options.add_session_config_entry("session.model_external_initializers_file_folder_path", str(self.weights))
        return ort.InferenceSession(self._cut(tensors).SerializeToString(), options, providers=["CPUExecutionProvider"])

    def _cut(self, tensors: list[str]) -> onnx.ModelProto:
        """The model reduced to the nodes `tensors` depend on, each tensor a flattened output."""
        graph = self.model.graph
        nodes, read = self._needed(tensors)
        cut = onnx.GraphProto(name=graph.name)
        cut.node.extend(graph.node[i] for i in nodes)
        cut.node.extend(helper.make_node("Reshape", [t, _FLAT], [t + _SAVED], name=t + _SAVED) for t in tensors)
        cut.input.extend(graph.input)
        inputs = {i.name for i in graph.input}
        cut.initializer.extend(i for i in graph.initializer if i.name in read or i.name in inputs)
        cut.initializer.append(numpy_helper.from_array(np.array([-1], dtype=np.int64), _FLAT))
        cut.sparse_initializer.extend(graph.sparse_initializer)
        cut.output.extend(helper.make_tensor_value_info(t + _SAVED, self.types[t].elem_type, [None]) for t in tensors)
        model = onnx.ModelProto()
        model.CopyFrom(self.model)
        model.graph.CopyFrom(cut)
        return model

    def _needed(self, tensors: list[str]) -> tuple[list[int], set[str]]:
        """Indexes (graph order) of the nodes computing `tensors`, and every name they read."""
        nodes: set[int] = set()
        read: set[str] = set()
        pending = list(tensors)
        while pending:
            name = pending.pop()
            if name in read:
                continue
            read.add(name)
            index = self.producer.get(name)
            if index is not None and index not in nodes:
                nodes.add(index)
                pending.extend(_reads(self.model.graph.node[index]))
        return sorted(nodes), read


def _reads(node: onnx.NodeProto) -> list[str]:
    """The names a node reads, those its subgraphs (If, Loop, Scan) take from the outer scope included."""
    names = [n for n in node.input if n]
    for attribute in node.attribute:
        for graph in (*([attribute.g] if attribute.HasField("g") else []), *attribute.graphs):
            for inner in graph.node:
                names += _reads(inner)
    return names


def chunks(names: list[str], size: Callable[[str], int | None], budget: int) -> Iterator[list[str]]:
    """`names` in order, grouped so that each group's known sizes add up to about `budget` bytes
    (at least one name per group). A name of unknown size counts as the largest known one."""
    known = [s for s in map(size, names) if s is not None]
    fallback = max(known, default=budget)
    group: list[str] = []
    held = 0
    for name in names:
        bytes_ = size(name)
        bytes_ = fallback if bytes_ is None else bytes_
        if group and held + bytes_ > budget:
            yield group
            group, held = [], 0
        group.append(name)
        held += bytes_
    if group:
        yield group
