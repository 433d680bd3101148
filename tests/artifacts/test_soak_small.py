"""A bounded soak of `temper serve` with benchmarks/soak.py's own load generator: a few thousand
requests of mixed batch sizes and sequence lengths through the padding batcher, on a real server
process. No request may fail, and the server's RSS must level off after the warm-up: ONNX
Runtime's arena and memory patterns are sized by the shapes seen, so unbounded growth shows here."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from benchmarks import soak
from tests.artifacts.runtimes import pooling_model

VOCAB, WIDTH = 4096, 64
TABLE = np.random.default_rng(0).standard_normal((VOCAB, WIDTH)).astype(np.float32)  # like a tiny encoder
REQUESTS = 3000
GROWTH_LIMIT = 48 * soak.MiB  # generous: the shapes reach a few MiB of activations at most


@pytest.mark.parametrize("options", [(), ("--instances", "2")], ids=["default", "2-workers"])
def test_mixed_shapes_serve_without_errors_and_rss_levels_off(tmp_path: Path, options: tuple[str, ...]) -> None:
    """RSS is the server's with its workers' (the sampler sums the process tree)."""
    folder = soak.make_bundle(pooling_model(tmp_path, TABLE), tmp_path / "bundle", name="tokens")
    load = soak.Load()
    with soak.serving(folder, tmp_path / "serve.log", ready_within_s=120, options=options) as (process, port):
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
