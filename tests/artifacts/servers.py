"""The HTTP serving tests' harness: tiny real ONNX models and bundles, a real uvicorn server on a free
loopback port, a keep-alive client, request and response helpers, `temper serve` in a new process."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Self

import numpy as np
import onnx
import onnxruntime as ort
import uvicorn
from onnx import TensorProto, helper, numpy_helper
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from temper.artifacts.formats import bundle
from temper.artifacts.serving.runtime import Runtime
from temper.artifacts.serving.server import InferenceServer
from tests.helpers import REPO

MODEL = "tiny"
MAX_BODY = 1024 * 1024


def _tiny_model(path: Path, seed: int = 0) -> Path:
    """y = x @ W + b (FP32 [-1, 2]) and total = row sums of ids (INT64 [-1, 1]); W and b from `seed`."""
    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array(rng.standard_normal((4, 2)).astype(np.float32), "W")
    b = numpy_helper.from_array(rng.standard_normal(2).astype(np.float32), "B")
    axes = numpy_helper.from_array(np.array([1], dtype=np.int64), "axes")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["xw"]), helper.make_node("Add", ["xw", "B"], ["y"]),
         helper.make_node("ReduceSum", ["ids", "axes"], ["total"], keepdims=1)],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4]),
         helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2]),
         helper.make_tensor_value_info("total", TensorProto.INT64, ["batch", 1])],
        [w, b, axes],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _slow_model(path: Path, inner: int = 1) -> Path:
    """y = sum(relu(tile(x) @ W) chained 24 times): a few milliseconds per row, for queueing tests; each row
    tiled into `inner` rows of that work first, for a single row that takes most of a second."""
    rng = np.random.default_rng(1)
    w = numpy_helper.from_array((rng.standard_normal((1024, 1024)) / 32).astype(np.float32), "W")
    repeats = numpy_helper.from_array(np.array([inner, 256], dtype=np.int64), "repeats")
    axes = numpy_helper.from_array(np.array([1], dtype=np.int64), "axes")
    shape = numpy_helper.from_array(np.array([-1, inner], dtype=np.int64), "shape")
    nodes = [helper.make_node("Tile", ["x", "repeats"], ["h0"])]
    for i in range(24):
        nodes += [helper.make_node("MatMul", [f"h{i}", "W"], [f"m{i}"]),
                  helper.make_node("Relu", [f"m{i}"], [f"h{i + 1}"])]
    if inner == 1:
        nodes.append(helper.make_node("ReduceSum", ["h24", "axes"], ["y"], keepdims=1))
    else:  # a row's `inner` sums, summed back into one per row
        nodes += [helper.make_node("ReduceSum", ["h24", "axes"], ["s"], keepdims=1),
                  helper.make_node("Reshape", ["s", "shape"], ["r"]),
                  helper.make_node("ReduceSum", ["r", "axes"], ["y"], keepdims=1)]
    graph = helper.make_graph(
        nodes, "slow", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 1])],
        [w, repeats, axes] + ([shape] if inner > 1 else []),
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _bundle(folder: Path, model: Path, name: str, **serving: object) -> Path:
    return bundle.write(folder, model, bundle.config_for(model, name, **serving))


class Served:
    """A real uvicorn server in a background thread, on a loopback socket bound to port 0, with the
    protocol and settings `temper serve` uses; `options` go to InferenceServer."""

    def __init__(self, runtime: Runtime, lifespan: str = "on", **options: object) -> None:
        self.app = InferenceServer(runtime, **{"max_body_bytes": MAX_BODY, **options})
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.server = uvicorn.Server(self.app.uvicorn_config(lifespan=lifespan))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> Self:
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "server did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.sock.close()


class Client:
    """One keep-alive HTTP/1.1 connection, as a real client holds it."""

    def __init__(self, port: int) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

    def call(self, method: str, path: str, body: bytes | None = None,
             headers: dict | None = None) -> tuple[int, dict, bytes]:
        self.conn.request(method, path, body=body, headers=headers or {})
        response = self.conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()

    def infer(self, request: dict, binary: bytes = b"", model: str = MODEL) -> tuple[int, dict, bytes]:
        head = json.dumps(request).encode()
        headers = {"Content-Type": "application/json"}
        if binary:
            headers = {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(head))}
        return self.call("POST", f"/v2/models/{model}/infer", head + binary, headers)

    def close(self) -> None:
        self.conn.close()


def _inputs(seed: int, rows: int = 2) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((rows, 4)).astype(np.float32),
            "ids": rng.integers(0, 1000, (rows, 3)).astype(np.int64)}


def _json_request(inputs: dict[str, np.ndarray], nested: bool = False) -> dict:
    kinds = {"float32": "FP32", "int64": "INT64"}
    return {"inputs": [{"name": k, "shape": list(v.shape), "datatype": kinds[v.dtype.name],
                        "data": v.tolist() if nested else v.ravel().tolist()} for k, v in inputs.items()]}


def _expected(session: ort.InferenceSession, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return dict(zip(["y", "total"], session.run(["y", "total"], inputs)))


def _binary_outputs(headers: dict, body: bytes) -> dict[str, np.ndarray]:
    """Decode a response that uses the binary tensor data extension."""
    length = int(headers["inference-header-content-length"])
    reply, offset, found = json.loads(body[:length]), length, {}
    types = {"FP32": np.float32, "INT64": np.int64}
    for out in reply["outputs"]:
        if "data" in out:
            found[out["name"]] = np.asarray(out["data"], dtype=types[out["datatype"]]).reshape(out["shape"])
            continue
        size = out["parameters"]["binary_data_size"]
        found[out["name"]] = np.frombuffer(
            body[offset:offset + size], dtype=np.dtype(types[out["datatype"]]).newbyteorder("<")).reshape(out["shape"])
        offset += size
    assert offset == len(body)
    return found


def _families(client: Client) -> dict[str, Metric]:
    """/metrics parsed by prometheus_client's own text-format parser, by family name. The parser names
    every counter sample `<name>_total` (OpenMetrics' form); a counter the text declares without that
    suffix, as Triton's are, gets its samples' names as written back."""
    status, headers, body = client.call("GET", "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain; version=0.0.4")
    text = body.decode()
    families = {family.name: family for family in text_string_to_metric_families(text)}
    for family in families.values():
        if family.type == "counter" and f"# TYPE {family.name} counter\n" in text:
            family.samples = [s._replace(name=family.name) for s in family.samples]
    return families


def _metrics(client: Client) -> dict[tuple[str, tuple], float]:
    """Every sample, named as the text names it: (sample name, its labels but model and version,
    sorted) -> value."""
    return {(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("model", "version")))): s.value
            for family in _families(client).values() for s in family.samples}


def _counter(metrics: dict[tuple[str, tuple], float], name: str, **labels: str) -> float:
    return metrics[name, tuple(sorted(labels.items()))]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve_process(target: str, port: int, env: dict | None = None, prelude: str = "",
                   args: tuple[str, ...] = ()) -> subprocess.Popen:
    """`temper serve TARGET --port PORT [ARGS]` in a new process; `prelude` is Python run first in it."""
    code = prelude + "import sys; from temper.pipeline.cli import main; sys.argv[0] = 'temper'; main()"
    return subprocess.Popen([sys.executable, "-c", code, "serve", target, "--port", str(port), *args], cwd=REPO,
                            env={**os.environ, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _wait_ready(process: subprocess.Popen, port: int) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()
        try:
            c = Client(port)
            ready = c.call("GET", "/v2/health/ready")[0] == 200
            c.close()
            if ready:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError("temper serve did not become ready")


@contextlib.contextmanager
def _temper_serve(target: str, env: dict | None = None, prelude: str = "",
                  args: tuple[str, ...] = ()) -> Iterator[tuple[int, dict[str, str]]]:
    """`temper serve TARGET [ARGS]` in a new process, ready: its port, and its output once stopped with Ctrl-C."""
    port = _free_port()
    process = _serve_process(target, port, env, prelude, args)
    output: dict[str, str] = {}
    try:
        _wait_ready(process, port)
        yield port, output
    finally:
        process.send_signal(signal.SIGINT)
        output["stdout"], output["stderr"] = process.communicate(timeout=30)
    # a graceful stop; main() may report the Ctrl-C uvicorn re-raises after shutting down as 128 + SIGINT
    assert process.returncode in (0, 128 + signal.SIGINT) and "Traceback" not in output["stderr"], output["stderr"]
