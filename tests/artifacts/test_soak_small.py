"""A bounded soak of `temper serve` with benchmarks/soak.py's own load generator: a few thousand
requests of mixed batch sizes and sequence lengths through the padding batcher, on a real server
process. No request may fail, and the server's RSS must level off after the warm-up: ONNX
Runtime's arena and memory patterns are sized by the shapes seen, so unbounded growth shows here."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from benchmarks import soak

VOCAB, WIDTH = 4096, 64
REQUESTS = 3000
GROWTH_LIMIT = 48 * soak.MiB  # generous: the shapes reach a few MiB of activations at most


def _token_model(path: Path) -> Path:
    """Per-token embeddings [batch, seq, 64] and their attention-masked mean [batch, 64], like a tiny encoder."""
    table = np.random.default_rng(0).standard_normal((VOCAB, WIDTH)).astype(np.float32)
    nodes = [
        helper.make_node("Gather", ["E", "input_ids"], ["gathered"]),
        helper.make_node("MatMul", ["gathered", "P"], ["tokens"]),
        helper.make_node("Cast", ["attention_mask"], ["maskf"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["maskf", "last"], ["mask3"]),
        helper.make_node("Mul", ["tokens", "mask3"], ["masked"]),
        helper.make_node("ReduceSum", ["masked", "seq"], ["total"], keepdims=0),
        helper.make_node("ReduceSum", ["maskf", "seq"], ["count"], keepdims=1),
        helper.make_node("Div", ["total", "count"], ["pooled"]),
    ]
    ids = [helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", "seq"])
           for name in ("input_ids", "attention_mask")]
    outputs = [helper.make_tensor_value_info("tokens", TensorProto.FLOAT, ["batch", "seq", WIDTH]),
               helper.make_tensor_value_info("pooled", TensorProto.FLOAT, ["batch", WIDTH])]
    constants = [numpy_helper.from_array(table, "E"),
                 numpy_helper.from_array(np.eye(WIDTH, dtype=np.float32) * 0.5, "P"),
                 numpy_helper.from_array(np.array([2], np.int64), "last"),
                 numpy_helper.from_array(np.array([1], np.int64), "seq")]
    graph = helper.make_graph(nodes, "tokens", ids, outputs, constants)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_mixed_shapes_serve_without_errors_and_rss_levels_off(tmp_path: Path) -> None:
    folder = soak.make_bundle(_token_model(tmp_path / "tokens.onnx"), tmp_path / "bundle", name="tokens")
    load = soak.Load()
    with soak.serving(folder, tmp_path / "serve.log", ready_within_s=120) as (process, port):
        before = soak.counters(port)
        sampler = soak.RssSampler(process.pid, 0.25, lambda: load.done)
        sampler.start()
        soak.run_load(port, "tokens", load, requests=REQUESTS, seconds=180, clients=4, vocab=VOCAB)
        sampler.stop()
        after = soak.counters(port)
    assert load.errors == 0, load.first_errors
    assert load.done == REQUESTS, f"only {load.done} requests in {load.seconds:.0f}s"
    executions = after["nv_inference_exec_count"] - before["nv_inference_exec_count"]
    assert after["nv_inference_request_success"] - before["nv_inference_request_success"] == REQUESTS
    assert executions < REQUESTS  # requests of different lengths shared padded batches
    _, warm = soak.rss_after_warmup(sampler.samples, 0.25)
    end = sampler.samples[-1][1]
    trace = [(round(t, 1), rss // soak.MiB, done) for t, rss, done in sampler.samples]
    assert end - warm < GROWTH_LIMIT, f"RSS grew {(end - warm) / soak.MiB:.0f} MiB after warm-up: {trace}"
