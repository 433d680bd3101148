"""Throughput on real onnxruntime sessions over tiny graphs. Timings are never compared with
absolute numbers (2 noisy cores): only with each other and with what was counted."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from temper.artifacts.core.errors import EnvironmentProblem
from temper.artifacts.core.onnx_io import load_structure
from temper.validators.throughput import batch_of, measure, session_for

WIDTH = 64


def _mlp(path: Path, batch: int | str, extra: list[int | str] | None = None) -> Path:
    """Three MatMul+Relu layers over [batch, *extra, WIDTH]: enough work that a call is not pure overhead."""
    shape = [batch, *(extra or []), WIDTH]
    weight = numpy_helper.from_array(np.random.default_rng(0).standard_normal((WIDTH, WIDTH)).astype(np.float32), "w")
    nodes, prev = [], "x"
    for i in range(3):
        nodes += [helper.make_node("MatMul", [prev, "w"], [f"m{i}"]), helper.make_node("Relu", [f"m{i}"], [f"r{i}"])]
        prev = f"r{i}"
    nodes.append(helper.make_node("Identity", [prev], ["y"]))
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
        [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


@pytest.fixture(scope="module")
def dynamic(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _mlp(tmp_path_factory.mktemp("models") / "dynamic.onnx", "batch")


@pytest.fixture(scope="module")
def fixed_one(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _mlp(tmp_path_factory.mktemp("models") / "fixed1.onnx", 1)


@pytest.fixture(scope="module")
def with_seq(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _mlp(tmp_path_factory.mktemp("models") / "seq.onnx", "batch", ["seq"])


def _rows(n: int) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(1).standard_normal((n, WIDTH)).astype(np.float32)}


def test_count_is_honest(dynamic: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every call onnxruntime executes is counted at its public entry points (pass-through, the
    real session runs): with warmup 0 there is exactly one warm-up call, so executed == runs + 1."""
    executed = []
    for method in ("run", "run_with_iobinding"):
        real = getattr(ort.InferenceSession, method)

        def counted(self: ort.InferenceSession, *args: object, _real: Callable = real, **kwargs: object) -> object:
            executed.append(1)
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(ort.InferenceSession, method, counted)

    m = measure(dynamic, _rows(32), 32, "cpu", duration_s=0.25, warmup_s=0)

    assert m.runs > 0 and len(executed) == m.runs + 1
    assert m.samples == 32 * m.runs
    assert m.seconds >= 0.25  # the loop stops only once the duration has elapsed


def test_percentiles_ordered_and_rate_consistent(dynamic: Path) -> None:
    m = measure(dynamic, _rows(8), 8, "cpu", duration_s=0.2, warmup_s=0.05)
    q = m.latency_ms
    assert list(q) == ["p50", "p90", "p95", "p99"]
    assert 0 < q["p50"] <= q["p90"] <= q["p95"] <= q["p99"]
    assert m.samples_per_s == pytest.approx(m.samples / m.seconds, rel=1e-9)
    assert m.provider == "cpu" and m.batch_size == 8 and m.gpu_mem_mb is None and m.peak_rss_mb > 0
    assert json.loads(json.dumps(m.as_dict()))["latency_ms"] == q


def test_fixed_batch_dim_rejects_other_sizes(fixed_one: Path) -> None:
    model = load_structure(fixed_one)
    assert batch_of(model, _rows(1), 1)["x"].shape == (1, WIDTH)
    with pytest.raises(ValueError, match="fixed to 1"):
        batch_of(model, _rows(1), 8)
    with pytest.raises(ValueError, match="fixed to 1"):
        measure(fixed_one, _rows(1), 8, "cpu", duration_s=0.2, warmup_s=0)


def test_short_sample_is_tiled_from_real_rows(dynamic: Path) -> None:
    sample = _rows(3)
    x = batch_of(load_structure(dynamic), sample, 8)["x"]
    assert x.shape == (8, WIDTH)
    for i in range(8):
        np.testing.assert_array_equal(x[i], sample["x"][i % 3])
    np.testing.assert_array_equal(batch_of(load_structure(dynamic), sample, 2)["x"], sample["x"][:2])


def test_cuda_on_cpu_only_onnxruntime_is_an_environment_problem(dynamic: Path) -> None:
    try:
        session_for(dynamic, "cuda")
    except EnvironmentProblem as exc:
        assert exc.exit_code == 3
        assert "'cuda'" in str(exc) and "CUDAExecutionProvider" in str(exc)
    else:
        pytest.skip("CUDA is really active here: a cuda session is legitimate")


def test_bench_json_one_entry_per_batch_size(temper: Callable, with_seq: Path) -> None:
    result = temper("bench", with_seq, "--batch-sizes", "1,4", "--dim", "seq=3",
                    "--duration", "0.2", "--warmup", "0", "--json")
    assert result.code == 0, result.stderr
    entries = json.loads(result.stdout)
    assert [e["batch_size"] for e in entries] == [1, 4]
    assert all(e["provider"] == "cpu" and e["samples"] == e["runs"] * e["batch_size"] > 0 for e in entries)


def test_bench_measures_the_session_serving_would_run_and_records_it(temper: Callable, dynamic: Path) -> None:
    """One thread choice for the model (all usable cores or 1, as the runtime makes it), spinning off,
    the same settings at every batch size."""
    from temper.artifacts.core.host import usable_cores

    result = temper("bench", dynamic, "--batch-sizes", "1,8", "--duration", "0.2", "--warmup", "0", "--json")
    assert result.code == 0, result.stderr
    sessions = [e["session"] for e in json.loads(result.stdout)]
    assert sessions[0] == sessions[1]
    assert sessions[0]["intra_op_threads"] in {1, usable_cores()}
    assert (sessions[0]["spinning"], sessions[0]["graph_optimization"]) == (False, "all")
    table = temper("bench", dynamic, "--batch-sizes", "2", "--duration", "0.2", "--warmup", "0")
    assert "intra-op threads, spinning off, graph optimization all" in " ".join(table.stdout.split())


def test_bench_table(temper: Callable, dynamic: Path) -> None:
    result = temper("bench", dynamic, "--batch-sizes", "2", "--duration", "0.2", "--warmup", "0")
    assert result.code == 0, result.stderr
    assert "samples/s" in result.stdout and "p99 ms" in result.stdout


def test_bench_symbolic_dim_without_size(temper: Callable, with_seq: Path) -> None:
    result = temper("bench", with_seq, "--batch-sizes", "1", "--duration", "0.2")
    assert result.code == 2
    assert len(result.stderr.strip().splitlines()) == 1
    assert "--dim" in result.stderr and "seq" in result.stderr


@pytest.mark.parametrize("dims, message", [
    (["seq=3", "sequ=4"], "'sequ' is not a symbolic dim of the model; its symbolic dims: seq"),
    (["seq=3", "batch=4"], "'batch' is the batch dim: give its sizes with --batch-sizes"),
])
def test_bench_refuses_a_dim_the_model_does_not_have(temper: Callable, with_seq: Path, dims: list[str],
                                                     message: str) -> None:
    """A misspelt --dim used to be ignored: the benchmark ran on sizes the user did not ask for."""
    result = temper("bench", with_seq, "--batch-sizes", "1", "--duration", "0.2",
                    *[arg for d in dims for arg in ("--dim", d)])
    assert result.code == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"error: {with_seq}: --dim: {message}"), line


@pytest.mark.parametrize("sizes", ["0,8", "1,x", ""])
def test_bench_bad_batch_sizes(temper: Callable, dynamic: Path, sizes: str) -> None:
    result = temper("bench", dynamic, "--batch-sizes", sizes, "--duration", "0.2")
    assert result.code == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "--batch-sizes" in result.stderr


def test_bench_fixed_batch_dim(temper: Callable, fixed_one: Path) -> None:
    result = temper("bench", fixed_one, "--batch-sizes", "1,8", "--duration", "0.2")
    assert result.code == 2 and "fixed to 1" in result.stderr


def test_bench_bad_model_file(temper: Callable, tmp_path: Path) -> None:
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"not a model")
    for path in (junk, tmp_path / "missing.onnx"):
        result = temper("bench", path, "--duration", "0.2")
        assert result.code == 2 and "MODEL" in result.stderr, result.stderr


def test_bench_cuda_is_exit_3(temper: Callable, dynamic: Path) -> None:
    try:
        session_for(dynamic, "cuda")
    except EnvironmentProblem:
        result = temper("bench", dynamic, "--provider", "cuda", "--batch-sizes", "1", "--duration", "0.2")
        assert result.code == 3 and "CUDAExecutionProvider" in result.stderr
    else:
        pytest.skip("CUDA is really active here: a cuda session is legitimate")
