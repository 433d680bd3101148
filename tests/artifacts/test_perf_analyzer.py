"""Triton's perf_analyzer runs unchanged against a real `temper serve --allow-client-shm`, over HTTP and
gRPC, with tensors in the request or in system shared memory (`--shared-memory system`), with its
default random input data (whose FP32 bit patterns include NaNs) and its server-side breakdown
(read from /stats, or ModelStatistics over gRPC).

perf_analyzer comes from tests/tools/perf_analyzer.sh, which `make test` runs first; when it cannot
be installed (no package index, no apt) this test fails, it never skips: CI is meant to run it."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("grpc")
tritongrpc = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException  # noqa: E402

from tests.artifacts.servers import _bundle, _free_port  # noqa: E402
from tests.helpers import REPO  # noqa: E402

MODEL = "digits-cnn"


def _cnn(path: Path) -> Path:
    """A digits-like FP32 CNN: image [batch, 1, 8, 8] -> Conv 3x3, Relu, Flatten, MatMul -> logits [batch, 10]."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((4, 1, 3, 3)) / 3).astype(np.float32), "W")
    fc = numpy_helper.from_array((rng.standard_normal((144, 10)) / 12).astype(np.float32), "FC")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["image", "W"], ["c"]), helper.make_node("Relu", ["c"], ["r"]),
         helper.make_node("Flatten", ["r"], ["f"]), helper.make_node("MatMul", ["f", "FC"], ["logits"])],
        "cnn", [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 1, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])], [w, fc])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@pytest.fixture(scope="module")
def perf_analyzer() -> Path:
    """The installed perf_analyzer wrapper (installed now if `make test` did not do it already)."""
    setup = subprocess.run(["bash", str(REPO / "tests/tools/perf_analyzer.sh")], capture_output=True, text=True,
                           env={**os.environ, "PYTHON": sys.executable}, timeout=600)
    if setup.returncode != 0:
        pytest.fail(f"perf_analyzer could not be installed (tests/tools/perf_analyzer.sh): {setup.stderr.strip()}")
    return Path(setup.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def cnn(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cnn")
    return _bundle(root / "bundle", _cnn(root / "cnn.onnx"), MODEL)


@contextlib.contextmanager
def _temper_serve(folder: Path, *flags: str) -> Iterator[tuple[int, int]]:
    """`temper serve FOLDER FLAGS` on REST and gRPC, ready: (port, grpc_port)."""
    port, grpc_port = _free_port(), _free_port()
    code = "import sys; from temper.pipeline.cli import main; sys.argv[0] = 'temper'; main()"
    process = subprocess.Popen([sys.executable, "-c", code, "serve", str(folder), "--port", str(port),
                                "--grpc-port", str(grpc_port), *flags], cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        client = tritongrpc.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        for _ in range(600):
            assert process.poll() is None, process.communicate()
            try:
                if client.is_model_ready(MODEL):
                    break
            except InferenceServerException:
                pass
            time.sleep(0.1)
        client.close()
        yield port, grpc_port
    finally:
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=30)
    assert "Traceback" not in stderr, stderr


@pytest.fixture(scope="module")
def serving(cnn: Path) -> Iterator[tuple[int, int]]:
    """`temper serve --allow-client-shm` of the CNN's bundle on REST and gRPC, ready: (port, grpc_port)."""
    with _temper_serve(cnn, "--allow-client-shm") as ports:
        yield ports


def _perf_analyzer(perf_analyzer: Path, protocol: str, port: int, memory: str,
                   *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(perf_analyzer), "-m", MODEL, "-i", protocol, "-u", f"127.0.0.1:{port}",
                           "--measurement-interval", "300", "--concurrency-range", "1:4:3",
                           "--stability-percentage", "1000", "--max-trials", "10", "--shared-memory", memory,
                           *extra], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("memory", ["none", "system"])
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_perf_analyzer_measures_temper_serve(perf_analyzer: Path, serving: tuple[int, int], protocol: str,
                                             memory: str) -> None:
    run = _perf_analyzer(perf_analyzer, protocol, serving[0] if protocol == "http" else serving[1], memory)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output
    throughputs = [float(t) for t in re.findall(r"Concurrency: \d+, throughput: ([\d.]+) infer/sec", output)]
    assert len(throughputs) == 2 and all(t > 0 for t in throughputs), output
    # the server-side breakdown, from temper's statistics: every request it counts succeeded
    served = [int(n) for n in re.findall(r"Server: \n\s+Inference count: \d+\n\s+Execution count: \d+\n"
                                         r"\s+Successful request count: (\d+)", output)]
    assert len(served) == 2 and all(n > 0 for n in served), output
    assert "Avg request latency" in output and "compute infer" in output, output


def test_perf_analyzer_shared_memory_is_the_servers_extension(perf_analyzer: Path, cnn: Path) -> None:
    """Without --allow-client-shm the same runs fail at registering their regions: the runs above did
    pass their tensors through temper's shared-memory extension, not the request body."""
    with _temper_serve(cnn) as (port, grpc_port):
        for protocol, at in (("http", port), ("grpc", grpc_port)):
            run = _perf_analyzer(perf_analyzer, protocol, at, "system")
            assert run.returncode != 0 and "start temper serve with --allow-client-shm" in run.stdout + run.stderr, \
                run.stdout + run.stderr


@pytest.mark.parametrize("way", ["bundle", "repository"])
def test_perf_analyzer_over_grpc_on_bundles_that_record_their_session(perf_analyzer: Path, tmp_path: Path,
                                                                      way: str) -> None:
    """Bundles `temper run` writes record the session settings the gates measured; Triton's ModelConfig holds them
    as a map, which perf_analyzer -i grpc reads before its first request (it exited 99 while they were a list).
    Served as the bundle itself and as the repository export-triton writes of it."""
    from temper.artifacts.engines.onnxruntime import SessionSettings
    from temper.artifacts.triton.config import export_repository

    recorded = SessionSettings(intra_op_threads=1, graph_optimization="extended")
    bundle = _bundle(tmp_path / "bundle", _cnn(tmp_path / "cnn.onnx"), MODEL, session=recorded)
    folder = bundle if way == "bundle" else export_repository(bundle, tmp_path / "repo").parent
    with _temper_serve(folder) as (_, grpc_port):
        run = _perf_analyzer(perf_analyzer, "grpc", grpc_port, "none")
    output = run.stdout + run.stderr
    assert run.returncode == 0, output
    assert len(re.findall(r"Concurrency: \d+, throughput: [\d.]+ infer/sec", output)) == 2, output


@pytest.mark.parametrize("memory", ["none", "system"])
def test_perf_analyzer_streaming_over_grpc(perf_analyzer: Path, serving: tuple[int, int], memory: str) -> None:
    """`-i grpc --streaming` sends its requests on ModelStreamInfer streams (one per concurrency slot): it hung until
    killed while the RPC answered UNIMPLEMENTED; now each request is answered on its stream, and the server's
    statistics count them as ModelInfer's."""
    run = _perf_analyzer(perf_analyzer, "grpc", serving[1], memory, "--streaming")
    output = run.stdout + run.stderr
    assert run.returncode == 0, output
    throughputs = [float(t) for t in re.findall(r"Concurrency: \d+, throughput: ([\d.]+) infer/sec", output)]
    assert len(throughputs) == 2 and all(t > 0 for t in throughputs), output
    served = [int(n) for n in re.findall(r"Server: \n\s+Inference count: \d+\n\s+Execution count: \d+\n"
                                         r"\s+Successful request count: (\d+)", output)]
    assert len(served) == 2 and all(n > 0 for n in served), output
