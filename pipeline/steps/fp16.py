"""FP16: ONNX Runtime's float16 converter, accepted only once a real batch stays finite in float16.

ORT's converter, not onnxconverter_common's: the latter with `keep_io_types` produced a
MiniLM that ONNX Runtime could not load. The finite check cannot just look at the outputs
on CPU: ONNX Runtime's CPU provider has no float16 kernel for most ops, runs them in FP32
and drops the float16 rounding in between, so a tensor past 65504 (Inf on a GPU) comes out
finite. Every float16 tensor is therefore read back as a float16 graph output.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto
from onnxruntime.transformers.float16 import convert_float_to_float16
from onnxruntime.transformers.onnx_model import OnnxModel

from temper.artifacts.core.errors import OptionError, StepFailed, close_names, first_line
from temper.artifacts.core.onnx_io import Batch, fit_batch, load_structure, save, session
from temper.pipeline.step_options import Fp16Options
from temper.pipeline.steps.base import Step, StepContext, require_known
from temper.pipeline.steps.tensor_probe import Probe, Saved, chunks, dims_of, named_dims

HINT = "keep the nodes it names in FP32 with node_block_list, or their op types with op_block_list"
CHUNK_BYTES = 256 * 2**20  # float16 tensors of one batch read back per run (the finite check's memory)


def _nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """All nodes, subgraphs (If/Loop bodies) included: the converter and its block lists reach them too."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.HasField("g"):
                yield from _nodes(attr.g)
            for sub in attr.graphs:
                yield from _nodes(sub)


def _did_you_mean(name: str, choices: list[str]) -> str:
    close = close_names(name, choices)
    return f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""


def _cast_to(node: onnx.NodeProto) -> int:
    return next(a.i for a in node.attribute if a.name == "to")


def _keep_fp32_between_blocked(graph: onnx.GraphProto) -> None:
    """Skip the converter's float -> float16 -> float round trips; drop Casts left unused.

    The converter casts every blocked node's output back to float16, even when the next node
    is blocked too, so a value past 65504 overflows whatever is blocked. ORT's own
    OnnxModel.convert_float_to_float16 removes these cascaded Casts the same way.
    """
    producers = {out: node for node in graph.node for out in node.output}
    for node in graph.node:
        parent = producers.get(node.input[0]) if node.op_type == "Cast" else None
        if parent is not None and parent.op_type == "Cast" and _cast_to(parent) == TensorProto.FLOAT16:
            if _cast_to(node) == TensorProto.FLOAT:
                node.input[0] = parent.input[0]
    used = {name for node in _nodes(graph) for name in node.input} | {out.name for out in graph.output}
    kept = [node for node in graph.node if node.op_type != "Cast" or node.output[0] in used]
    del graph.node[:]
    graph.node.extend(kept)


def _non_finite(path: Path, weights: Path, names: list[str], feed: Batch) -> dict[str, np.ndarray]:
    """Flat NaN/Inf masks of the named tensors that have any, read a bounded chunk at a time
    (tensor_probe's walk, each node run once): all of them as outputs of one run held MiniLM's every
    activation (4.9 GiB).

    `path` is a shape-inferred model whose external data lives in `weights`.
    """
    model = load_structure(path)
    infos = {v.name: v for v in (*model.graph.value_info, *model.graph.input, *model.graph.output)}
    names = [n for n in dict.fromkeys(names) if n in infos]  # untyped by shape inference: nothing to compare
    types = {n: Saved(infos[n].type.tensor_type.elem_type, dims_of(infos[n])) for n in names}
    named = named_dims(path, [feed])
    walk = Probe(path, types, weights).walk([feed], set(names))
    found = {}
    for chunk in chunks(names, lambda n: types[n].nbytes(named), CHUNK_BYTES):
        for name, value in next(walk.read(chunk)).items():
            if np.issubdtype(value.dtype, np.floating) and not np.isfinite(value).all():
                found[name] = ~np.isfinite(value)
    return found


def _twins(half: onnx.ModelProto, full: onnx.ModelProto) -> dict[str, str]:
    """Converted tensor name -> the FP32 model's tensor (or input) holding the same values.

    Names are kept, except where the converter renames a node's output (graph outputs
    become `graph_output_cast_<i>`): those map through the node of the same name. Its
    inserted Casts (`graph_input_cast_<i>`...) hold the values of what they cast.
    """
    twins = {out: out for node in full.graph.node for out in node.output} | {i.name: i.name for i in full.graph.input}
    nodes = {node.name: node for node in full.graph.node if node.name}
    for node in half.graph.node:
        twin = nodes.get(node.name)
        for index, out in enumerate(node.output):
            if out in twins:
                continue
            if twin is not None and index < len(twin.output):
                twins[out] = twin.output[index]
            elif node.op_type == "Cast" and node.input[0] in twins:
                twins[out] = twins[node.input[0]]
    return twins


def _half_feed(half: onnx.ModelProto, feed: Batch) -> Batch:
    """The batch as the converted model takes it; an input float16 cannot hold is reported here."""
    halves = {v.name for v in half.graph.input if v.type.tensor_type.elem_type == TensorProto.FLOAT16}
    with np.errstate(over="ignore"):
        cast = {k: v.astype(np.float16) if k in halves else v for k, v in feed.items()}
    for key in halves:
        if (~np.isfinite(cast[key]) & np.isfinite(feed[key])).any():
            raise StepFailed(f"fp16: model input '{key}' holds values past float16's 65504 on a real batch: "
                             "convert with keep_io_types: true and keep the nodes reading it in FP32")
    return cast


def _blame(name: str, twin: str | None, full: onnx.ModelProto, node: onnx.NodeProto) -> tuple[str, str]:
    """Where a failing float16 tensor comes from and which nodes to block, in the FP32 graph's names."""
    source = next((n for n in full.graph.node if twin in n.output), None)
    readers = [n.name for n in full.graph.node if twin in n.input]
    if source is None and not readers:  # no FP32 twin: name what the converted graph has
        source = node
    origin = (f"output of node '{source.name}' ({source.op_type})" if source
              else f"the float16 copy of model input '{twin}'")
    block = ", ".join(f"'{n}'" for n in ([source.name] if source else []) + readers)
    who = "that node and its readers" if source else "the nodes reading it"
    return (f"'{name}', {origin}",
            f"keep {who} in FP32 with node_block_list [{block}], or their op types with op_block_list")


class Fp16(Step[Fp16Options]):
    name = "fp16"
    options_model = Fp16Options
    searchable = ("keep_io_types",)

    def precision(self, options: Fp16Options) -> str:
        return "fp16"

    def validate(self, model: onnx.ModelProto, options: Fp16Options) -> None:
        nodes = list(_nodes(model.graph))
        require_known("node_block_list", "node", options.node_block_list, [n.name for n in nodes if n.name])
        # An op type absent from this graph is fine (ORT's own list is mostly absent ones), a typo is not.
        used = {n.op_type for n in nodes}
        for i, op in enumerate(options.op_block_list or []):
            if op not in used and not onnx.defs.has(op):
                choices = sorted(used | {s.name for s in onnx.defs.get_all_schemas()})
                message = f"'{op}' is not an ONNX op type nor used in this graph{_did_you_mean(op, choices)}"
                raise OptionError(f"op_block_list[{i}]", message)

    def run(self, src: Path, dst: Path, options: Fp16Options, ctx: StepContext) -> None:
        inferred = ctx.scratch / "inferred.onnx"
        try:
            # The converter needs every tensor's type; path-based inference also works past 2 GB.
            onnx.shape_inference.infer_shapes_path(str(src), str(inferred))
            model = onnx.load(str(inferred), load_external_data=False)
            onnx.load_external_data_for_model(model, str(src.parent))
            model = convert_float_to_float16(
                model,
                keep_io_types=options.keep_io_types,
                op_block_list=options.op_block_list,
                node_block_list=options.node_block_list,
                disable_shape_infer=True,
            )
            _keep_fp32_between_blocked(model.graph)
            OnnxModel.graph_topological_sort(model.graph)  # the converter appends its Casts at the end
        except Exception as err:  # the converter asserts, raises ValueError, RuntimeError...
            raise StepFailed(f"fp16: onnxruntime's float16 converter failed: {first_line(err)}") from err
        save(model, dst)
        try:
            session(dst)
        except Exception as err:
            raise StepFailed(f"fp16: the converted model does not load in onnxruntime: "
                             f"{first_line(err)}; {HINT}") from err
        self._check_finite(src, inferred, dst, fit_batch(load_structure(dst), ctx.sample(), ctx.layout))

    @staticmethod
    def _check_finite(src: Path, inferred: Path, dst: Path, feed: Batch) -> None:
        """Fail on the first float16 tensor with NaN/Inf where the FP32 model's tensor is finite."""
        half = load_structure(dst)
        half_feed = _half_feed(half, feed)
        types = {v.name: v.type.tensor_type.elem_type for v in half.graph.value_info}
        outputs = {o.name for o in half.graph.output}
        producers = {out: node for node in half.graph.node for out in node.output}
        watched = [name for name in producers if types.get(name) == TensorProto.FLOAT16 or name in outputs]
        try:
            bad = _non_finite(dst, dst.parent, watched, half_feed)
        except Exception as err:
            raise StepFailed(f"fp16: the converted model fails on a real batch: {first_line(err)}; {HINT}") from err
        if not bad:
            return
        full = load_structure(inferred)
        twins = _twins(half, full)
        full_bad = {k: ~np.isfinite(np.ravel(v)) for k, v in feed.items() if np.issubdtype(v.dtype, np.floating)}
        suspects = [twins[n] for n in bad if n in twins and twins[n] not in feed]
        full_bad |= _non_finite(inferred, src.parent, suspects, feed)
        for name in (n for n in watched if n in bad):
            twin = twins.get(name)
            fresh = bad[name] & ~full_bad[twin] if twin in full_bad else bad[name]
            if fresh.any():
                where, remedy = _blame(name, twin, full, producers[name])
                raise StepFailed(
                    f"fp16: non-finite values (NaN/Inf) in float16 where FP32 is finite, first in {where} "
                    f"({int(fresh.sum())} of {fresh.size} values); float16 ends at 65504: {remedy}"
                )
