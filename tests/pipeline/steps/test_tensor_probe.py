"""The probe's walk reads a model's tensors chunk by chunk as a whole read would, running each node
once per feed: what a chunk computed that later nodes need is kept, not computed again."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from temper.pipeline.steps.tensor_probe import Probe, saved_tensors
from tests.pipeline.steps.quantize_models import conv_net, heavy_tailed


@pytest.fixture()
def net(tmp_path: Path) -> Path:
    return conv_net(tmp_path / "net.onnx")


def _whole(path: Path, names: list[str], feeds: list[dict]) -> list[dict[str, np.ndarray]]:
    return list(Probe(path, saved_tensors(path)).read(names, feeds))


def _walked(probe: Probe, names: list[str], feeds: list[dict]) -> tuple[list[dict[str, np.ndarray]], int]:
    walk = probe.walk(feeds, set(names))
    reads: list[dict[str, np.ndarray]] = [{} for _ in feeds]
    for name in names:  # a chunk per tensor: the most chunks, the most crossings
        for index, values in enumerate(walk.read([name])):
            reads[index] |= values
    return reads, walk.nodes_run


def test_a_walk_reads_what_one_whole_read_does_and_runs_every_node_once(net):
    saved = saved_tensors(net)
    names, feeds = list(saved), [heavy_tailed(seed, rows=4) for seed in range(2)]
    probe = Probe(net, saved)
    walked, nodes_run = _walked(probe, names, feeds)
    for ours, theirs in zip(walked, _whole(net, names, feeds), strict=True):
        assert ours.keys() == theirs.keys() and len(ours) == len(names) >= 7
        for name in names:
            np.testing.assert_array_equal(ours[name], theirs[name])
    graph_nodes = len(onnx.load(str(net)).graph.node)
    assert nodes_run == graph_nodes  # each once; a cut per chunk from the inputs ran every prefix again
    assert sum(len(probe.needed([n], set())[0]) for n in names) > 2 * graph_nodes


def test_a_tensor_of_unknown_type_is_not_kept_and_its_node_runs_again_where_needed(net, monkeypatch):
    saved = saved_tensors(net)
    names, feeds = list(saved), [heavy_tailed(3, rows=4)]
    probe = Probe(net, saved)
    typed = probe.element_types()
    assert typed["r1"] == onnx.TensorProto.FLOAT
    monkeypatch.setattr(probe, "element_types", lambda: {k: v for k, v in typed.items() if k != "r1"})
    walked, nodes_run = _walked(probe, names, feeds)
    whole = _whole(net, names, feeds)[0]
    for name in names:
        np.testing.assert_array_equal(walked[0][name], whole[name])
    assert nodes_run == len(onnx.load(str(net)).graph.node) + 1  # relu1 again, for conv2


def test_a_walk_refuses_a_read_it_was_not_told_of_or_a_second_read(net):
    saved = saved_tensors(net)
    walk = Probe(net, saved).walk([heavy_tailed(0, rows=2)], {"c1"})
    with pytest.raises(ValueError, match="r1"):
        next(walk.read(["r1"]))
    next(walk.read(["c1"]))
    with pytest.raises(ValueError, match="c1"):
        next(walk.read(["c1"]))
