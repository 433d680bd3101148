"""pipeline.steps.quantize.fallback's search (doubling, then bisection) against a pure-data scorer.

No model is quantized: the graph rewrite is replaced by a writer that records which nodes stay float,
and the scorer computes a drop from that set alone, so every trial's outcome is known in advance.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from temper.artifacts.core.errors import StepFailed
from temper.pipeline.quantize_backends import OrtOptions, quantize_options
from temper.pipeline.steps.quantize import fallback
from temper.pipeline.steps.quantize.sensitivity import NodeSensitivity
from temper.validators.scoring import Score

ALLOWED_DROP = 0.01


class DataScorer:
    """The recipe's gates as a table: the drop is the summed harm of the nodes left quantized."""

    metric, baseline_metric, allowed_drop = "top1", 0.95, ALLOWED_DROP

    def __init__(self, harm: dict[str, float], speed: Callable[[frozenset[str]], float | None] = lambda _: None):
        self.harm, self.speed_of = harm, speed

    def score(self, model: Path) -> Score:
        drop = sum(h for node, h in self.harm.items() if node not in _float_nodes(model))
        return Score(self.baseline_metric - drop, drop, 1.0 - drop, [])

    def speed(self, model: Path) -> float | None:
        return self.speed_of(_float_nodes(model))


def _float_nodes(model: Path) -> frozenset[str]:
    return frozenset(json.loads(model.read_text()))


def _search(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, ranking: list[str], scorer: DataScorer, *,
            max_trials: int = 12, refine: int = 0, keep_float: list[str] | None = None,
            blocks: dict[str, str] | None = None, prepare: fallback.Prepare | None = None,
            no_op: frozenset[str] = frozenset()) -> tuple[dict[str, Any], list[str]]:
    """Run `fallback.tune` with fakes for the rewrite and the SQNR ranking; return tuning.json and the output's
    float nodes. Nodes of `no_op` leave the written graph as it is (a MaxPool behind a float Relu)."""
    monkeypatch.setattr(fallback.quantize_static, "write", lambda prepared, path, options, nodes: Path(path).write_text(
        json.dumps(sorted(set(nodes) - no_op))))
    monkeypatch.setattr(fallback, "graph_digest", lambda path: (Path(path).read_text(),))
    ranked = [NodeSensitivity(n, "Conv", (blocks or {}).get(n, ""), -float(i), None) for i, n in enumerate(ranking)]
    monkeypatch.setattr(fallback.sensitivity, "rank", lambda prepared, options, feeds, scratch, **_: ranked)
    monkeypatch.setattr(fallback.quantize_static, "unbinnable", lambda prepared, method: None)  # no ranges here
    # the census of the fake graph: 100 quantized compute nodes, each float node one fewer (floor: 50)
    monkeypatch.setattr(fallback, "count_quantized", lambda path: QUANTIZED - len(_float_nodes(path)))
    options = quantize_options(
        {"mode": "static", "preset": None, "fallback": {"max_trials": max_trials, "refine": refine}})
    dst = tmp_path / "out" / "model.onnx"
    dst.parent.mkdir()
    feeds = [{"x": np.zeros((4, 1), np.float32)}]
    fallback.tune(None, dst, options, keep_float or [], feeds, scorer, tmp_path,  # type: ignore[arg-type]
                  prepare=prepare)
    return json.loads((dst.parent / "tuning.json").read_text()), sorted(_float_nodes(dst))


def _sizes(record: dict[str, Any]) -> list[tuple[str, int]]:
    return [(t["kind"], len(t["float_nodes"])) for t in record["trials"]]


NODES = [f"n{i}" for i in range(10)]
QUANTIZED = 100


def test_doubling_counts():
    assert list(fallback._doubling(0)) == []
    assert list(fallback._doubling(1)) == [1]
    assert list(fallback._doubling(5)) == [1, 2, 4, 5]
    assert list(fallback._doubling(8)) == [1, 2, 4, 8]


def test_a_plain_model_that_holds_the_budget_ends_the_search(monkeypatch, tmp_path):
    record, kept = _search(monkeypatch, tmp_path, NODES, DataScorer({"n0": ALLOWED_DROP / 2}))
    assert _sizes(record) == [("plain", 0)] and record["met"] and record["best"] == 0
    assert kept == [] and record["ranking"] == []  # no ranking needed


def test_doubling_then_bisection_finds_the_fewest_leading_nodes(monkeypatch, tmp_path):
    """Budget holds iff n0..n5 are float: 1, 2, 4 fail, 8 holds; bisection tries 6 (holds) and 5 (fails)."""
    harm = {n: 0.02 for n in NODES[:6]}
    record, kept = _search(monkeypatch, tmp_path, NODES, DataScorer(harm))
    assert _sizes(record) == [("plain", 0), ("cumulative", 1), ("cumulative", 2), ("cumulative", 4),
                              ("cumulative", 8), ("cumulative", 6), ("cumulative", 5)]
    assert record["met"] and kept == NODES[:6]
    assert record["trials"][record["best"]]["float_nodes"] == NODES[:6]
    assert [r["node"] for r in record["ranking"]] == NODES


def test_the_whole_ranking_is_the_last_doubling_step(monkeypatch, tmp_path):
    harm = {n: 0.02 for n in NODES}  # only everything in float holds
    record, kept = _search(monkeypatch, tmp_path, NODES, DataScorer(harm))
    assert [n for _, n in _sizes(record)] == [0, 1, 2, 4, 8, 10, 9]
    assert kept == NODES


def test_an_unreachable_budget_keeps_the_smallest_drop_within_max_trials(monkeypatch, tmp_path):
    harm = {**{n: 0.001 for n in NODES}, "unranked": 1.0}  # a harm no ranked node can remove
    record, kept = _search(monkeypatch, tmp_path, NODES, DataScorer(harm), max_trials=4)
    assert len(record["trials"]) == 4 and not record["met"] and record["max_trials"] == 4
    assert record["trials"][record["best"]]["drop"] == min(t["drop"] for t in record["trials"])
    assert kept == NODES[:4]


def test_bisection_stops_at_max_trials(monkeypatch, tmp_path):
    harm = {n: 0.02 for n in NODES[:6]}
    record, kept = _search(monkeypatch, tmp_path, NODES, DataScorer(harm), max_trials=6)
    assert [n for _, n in _sizes(record)] == [0, 1, 2, 4, 8, 6]
    assert kept == NODES[:6]


def test_refine_reranks_suspects_by_their_measured_drop(monkeypatch, tmp_path):
    """The SQNR order a, b, c is wrong: alone in float, b removes most of the drop, then c."""
    harm = {"a": 0.001, "b": 0.05, "c": 0.02}
    record, kept = _search(monkeypatch, tmp_path, ["a", "b", "c", "d", "e"], DataScorer(harm), refine=3)
    # b alone was tried while refining: the cumulative step of one node costs nothing more
    assert [(t["kind"], t["float_nodes"]) for t in record["trials"]] == [
        ("plain", []), ("refine", ["a"]), ("refine", ["b"]), ("refine", ["c"]), ("cumulative", ["b", "c"])]
    assert kept == ["b", "c"] and record["met"]


def test_among_passing_trials_the_most_quantized_then_the_most_faithful_then_the_fewest_float_nodes_win():
    def trial(nodes: list[str], passed: bool, speed: float | None = None, drop: float = 0.0, cosine: float = 0.99,
              quantized: int | None = None) -> fallback.Trial:
        return fallback.Trial("cumulative", nodes, 0.9, drop, cosine, speed, passed,
                              QUANTIZED - len(nodes) if quantized is None else quantized)

    options = quantize_options({"mode": "static", "preset": None, "fallback": {}})
    tuner = fallback._Tuner(None, options, [], DataScorer({}), Path("unused"))  # type: ignore[arg-type]
    tuner.trials = [trial(["a", "b", "c"], True, 90.0), trial(["a", "b"], True, 10.0), trial(["c", "d"], True, 20.0),
                    trial(["e"], False, 99.0), trial(["f", "g"], True, None)]
    assert tuner.best().float_nodes == ["c", "d"]  # equally quantized and faithful: the fewest, then the fastest
    # MiniLM's case: more float nodes that are no compute nodes, the same 42 quantized, a better cosine
    tuner.trials = [trial(["a"] * 54, True, 50.0, cosine=0.961, quantized=42),
                    trial(["b"] * 64, True, 40.0, cosine=0.985, quantized=42),
                    trial(["c"] * 70, True, 30.0, cosine=0.999, quantized=41)]
    assert tuner.best().cosine == 0.985
    tuner.trials = [trial([], False, drop=0.3), trial(["a"], False, drop=0.1), trial(["a", "b"], False, drop=0.2)]
    assert tuner.best().float_nodes == ["a"]  # none passed: the smallest drop


def test_a_node_set_that_writes_a_graph_tried_already_is_that_trial_and_spends_no_trial(monkeypatch, tmp_path):
    """n1 in float changes nothing once n0 is (it has no Q/DQ of its own left): top-2 writes top-1's graph, so
    the search goes on to top-4 within the same max_trials, and no two trials are the same model."""
    harm = {"n0": 0.004, "n2": 0.004, "n3": 0.004, "n4": 0.004}
    record, kept = _search(monkeypatch, tmp_path, NODES, DataScorer(harm), max_trials=3, no_op=frozenset({"n1"}))
    assert _sizes(record) == [("plain", 0), ("cumulative", 1), ("cumulative", 4)]
    assert record["met"] and kept == ["n0", "n2", "n3"]
    assert record["same_graph"] == [{"float_nodes": ["n0", "n1"], "trial": 1}]
    written = [sorted(set(t["float_nodes"]) - {"n1"}) for t in record["trials"]]
    assert len({tuple(w) for w in written}) == len(written)


def test_recipe_float_nodes_are_never_searched_but_always_kept(monkeypatch, tmp_path):
    harm = {"n0": 0.02, "n1": 0.02}
    record, kept = _search(monkeypatch, tmp_path, ["n0", "fixed", "n1"], DataScorer(harm), keep_float=["fixed"])
    assert "fixed" not in [r["node"] for r in record["ranking"]]
    assert all("fixed" not in t["float_nodes"] for t in record["trials"])
    assert kept == ["fixed", "n0", "n1"]


def test_a_mostly_float_block_goes_float_whole():
    blocks = {"layer.1": ["a", "b", "c", "d"], "layer.2": ["e", "f", "g", "h", "i"]}
    assert fallback._whole_blocks(["a"], blocks) == ["a"]  # one node never pulls its block
    assert fallback._whole_blocks(["a", "b"], blocks) == ["a", "b", "c", "d"]  # half of it does
    assert fallback._whole_blocks(["e", "f"], blocks) == ["e", "f"]  # two of five: less than half
    assert fallback._whole_blocks(["e", "f", "g", "x"], blocks) == ["e", "f", "g", "h", "i", "x"]


def test_blocks_group_ranked_nodes_and_leave_unnamed_ones_alone(monkeypatch, tmp_path):
    harm = {"b1": 0.02}
    blocks = {"a1": "layer.0", "a2": "layer.0", "b1": "layer.1", "a3": "layer.0"}
    record, _ = _search(monkeypatch, tmp_path, ["a1", "a2", "b1", "a3", "free"], DataScorer(harm), blocks=blocks)
    # top 2 (a1, a2) are two of layer.0's three: a3 joins them
    assert [t["float_nodes"] for t in record["trials"]][:3] == [[], ["a1"], ["a1", "a2", "a3"]]


def test_first_samples_takes_leading_batches_until_enough():
    feeds = [{"x": np.zeros((4, 2))} for _ in range(3)]
    assert len(fallback.first_samples(feeds, 4)) == 1
    assert len(fallback.first_samples(feeds, 5)) == 2
    assert len(fallback.first_samples(feeds, 100)) == 3


def test_a_configuration_that_does_not_calibrate_is_skipped_and_the_node_search_goes_on(monkeypatch, tmp_path):
    """MiniLM's percentile calibration refuses the attention mask's -inf ("supplied range of [-inf, inf] is
    not finite"): that configuration is recorded as skipped, not a build error, and the nodes are searched."""
    def prepare(options: OrtOptions) -> tuple[Any, list[str]]:
        if options.calibration == "percentile":
            raise StepFailed("quantize: calibration failed: ValueError: supplied range of [-inf, inf] is not finite")
        return None, []

    harm = {n: 0.02 for n in NODES[:2]}
    record, kept = _search(monkeypatch, tmp_path, NODES, DataScorer(harm), prepare=prepare)
    tried = {json.dumps(c["changes"], sort_keys=True): c for c in record["configurations"]}
    skipped = tried[json.dumps({"calibration": "percentile"})]  # per_channel did not help, so alone
    assert "not finite" in skipped["error"] and not skipped["passed"]
    assert record["met"] and kept == ["n0", "n1"]
