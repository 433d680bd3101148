"""Read a model's intermediate tensors a few at a time, so memory holds only those.

Making every tensor a graph output (ONNX Runtime's qdq_loss_debug, the fp16 step's finite check)
holds them all: a session keeps every graph output of a run alive until the run ends, requested
or not, so one batch through BERT holds every activation at once (17.9 GiB for MiniLM's fallback
ranking, 4.9 GiB for its fp16 check). A probe instead builds, per set of tensors, a model cut down
to the nodes those tensors need, with just them as outputs (flattened by a Reshape, as
qdq_loss_debug does, so that graph inputs can be read the same way); `chunks` groups tensors
into such sets by their size.

Read set after set from the graph inputs, each cut recomputes what the sets before it computed: a
model read in ten chunks runs about five whole passes. A `Walk` reads the sets in turn over the same
feeds and computes every node once per feed: what a cut computed that a later node or a later read
needs (the residual stream, an attention mask) is kept per feed and fed to the next cut as an input.
Those kept tensors are held beside the chunk; a model's boundary between two layers is a few of them.
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

from temper.artifacts.core import native_logs
from temper.artifacts.core.onnx_io import Batch

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
        """For each feed, {tensor: flat array} of `tensors`, computed from the graph inputs; one
        session serves every feed."""
        yield from self.walk(feeds, set(tensors)).read(tensors)

    def walk(self, feeds: list[Batch], wanted: set[str]) -> Walk:
        """Reads of several sets of tensors in turn over `feeds`, each node computed once per feed.
        `wanted`: every tensor the reads will ask for (kept once computed, until read)."""
        return Walk(self, feeds, wanted)

    def session(self, cut: onnx.GraphProto) -> ort.InferenceSession:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # as collect_activations
        options.log_severity_level = native_logs.severity()
        options.enable_cpu_mem_arena = False  # a chunk's outputs go back to the OS when it is done
        options.add_session_config_entry("session.model_external_initializers_file_folder_path", str(self.weights))
        model = onnx.ModelProto()
        model.CopyFrom(self.model)
        model.graph.CopyFrom(cut)
        return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])

    def needed(self, tensors: list[str], known: set[str]) -> tuple[list[int], set[str]]:
        """Indexes (graph order) of the nodes computing `tensors` from the graph inputs and the `known`
        tensors, and every name they read."""
        nodes: set[int] = set()
        read: set[str] = set()
        pending = list(tensors)
        while pending:
            name = pending.pop()
            if name in read:
                continue
            read.add(name)
            index = None if name in known else self.producer.get(name)
            if index is not None and index not in nodes:
                nodes.add(index)
                pending.extend(_reads(self.model.graph.node[index]))
        return sorted(nodes), read

    def element_types(self) -> dict[str, int]:
        """Every tensor's element type as shape inference gives it (0 where it cannot)."""
        inferred = onnx.shape_inference.infer_shapes(self.model)
        graph = inferred.graph
        return {v.name: v.type.tensor_type.elem_type for v in (*graph.value_info, *graph.input, *graph.output)}


class Walk:
    """Sets of tensors read in turn over the same feeds (Probe.walk). Each cut runs only the nodes no
    earlier cut ran; what they computed that a node not yet run or a read still to come needs is kept
    per feed and given to the next cut as an input. A tensor whose type shape inference cannot tell is
    not kept: the node computing it counts as not run, and runs again where it is needed."""

    def __init__(self, probe: Probe, feeds: list[Batch], wanted: set[str]) -> None:
        self.probe, self.feeds, self.pending = probe, feeds, set(wanted)
        self.ran: set[int] = set()
        self.kept: list[dict[str, np.ndarray]] = [{} for _ in feeds]
        self.nodes_run = 0  # nodes in the cuts so far: each node once, but for untyped outputs
        self._types: dict[str, int] | None = None

    def read(self, tensors: list[str]) -> Iterator[dict[str, np.ndarray]]:
        """For each feed, {tensor: flat array} of `tensors` (each announced in `wanted`, read once);
        one session serves every feed."""
        if not set(tensors) <= self.pending:
            raise ValueError(f"not announced to this walk, or read already: {sorted(set(tensors) - self.pending)}")
        probe, graph = self.probe, self.probe.model.graph
        known = set(self.kept[0]) if self.kept else set()
        nodes, read = probe.needed(tensors, known)
        self.pending.difference_update(tensors)
        later, ran = self._later(nodes)
        fresh = sorted(out for i in nodes if i in ran for out in graph.node[i].output if out in later)
        given = sorted(known & read)
        cut = onnx.GraphProto(name=graph.name)
        cut.node.extend(graph.node[i] for i in nodes)
        cut.node.extend(helper.make_node("Reshape", [t, _FLAT], [t + _SAVED], name=t + _SAVED) for t in tensors)
        cut.input.extend(graph.input)
        cut.input.extend(helper.make_tensor_value_info(t, helper.np_dtype_to_tensor_dtype(self.kept[0][t].dtype), None)
                         for t in given)
        inputs = {i.name for i in graph.input}
        cut.initializer.extend(i for i in graph.initializer if i.name in read or i.name in inputs)
        cut.initializer.append(numpy_helper.from_array(np.array([-1], dtype=np.int64), _FLAT))
        cut.sparse_initializer.extend(graph.sparse_initializer)
        cut.output.extend(helper.make_tensor_value_info(t + _SAVED, probe.types[t].elem_type, [None]) for t in tensors)
        cut.output.extend(helper.make_tensor_value_info(t, self._type(t), None) for t in fresh)
        self.nodes_run += len(nodes)
        self.ran = ran
        session = probe.session(cut)
        for index, feed in enumerate(self.feeds):
            values = session.run(None, {**feed, **{t: self.kept[index][t] for t in given}})
            kept = {t: v for t, v in self.kept[index].items() if t in later}
            self.kept[index] = kept | dict(zip(fresh, values[len(tensors):], strict=True))
            read_now = dict(zip(tensors, values[: len(tensors)], strict=True))
            del values, kept
            yield read_now

    def _later(self, nodes: list[int]) -> tuple[set[str], set[int]]:
        """The names needed after a cut of `nodes` (read by a node not run, or a read to come), and
        the nodes run by then: a node with such an output of unknown type counts as not run."""
        graph = self.probe.model.graph
        ran = self.ran | set(nodes)
        while True:
            later = self.pending | {name for i, node in enumerate(graph.node) if i not in ran for name in _reads(node)}
            untyped = {i for i in nodes
                       if i in ran and any(o in later and not self._type(o) for o in graph.node[i].output)}
            if not untyped:
                return later, ran
            ran -= untyped

    def _type(self, name: str) -> int:
        if self._types is None:
            self._types = self.probe.element_types()
        return self._types.get(name, 0)


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
