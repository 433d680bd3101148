"""The servers benchmarks/serving.py measures: (a) `temper serve`, (b) `mlflow models serve` and (p) the
plain one-request-per-call server, each a process in a session of its own.

`Server` starts, health-checks, restarts and stops one of them by its PID, so a run (or an
interrupted one) leaves no server behind. The plain server's own code, `plain_server_main`, runs in
the child that `serving.py --plain-server` starts.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.serving_host import BIN, SCRIPT, child_env, log
from benchmarks.serving_models import Model


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(port: int, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None,
         timeout: float = 30) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


@dataclass
class Server:
    name: str
    proc: subprocess.Popen
    port: int
    logfile: Path
    cmd: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    ready_path: str = "/"
    restarts: int = 0
    grpc_port: int | None = None

    def ensure(self) -> None:
        """Restart the server (same port) if it has gone away since the last point, and count it."""
        try:
            alive = self.proc.poll() is None and request(self.port, "GET", self.ready_path, timeout=5)[0] == 200
        except OSError:
            alive = False
        if alive:
            return
        log(f"  {self.name} is gone (exit status {self.proc.poll()}; see {self.logfile}): restarting it")
        self.stop()
        self.restarts += 1
        with open(self.logfile, "ab") as out:
            self.proc = subprocess.Popen(self.cmd, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True, cwd=self.logfile.parent)
        self.wait(self.ready_path, 300)

    def wait(self, path: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"error: {self.name} exited {self.proc.returncode} while starting; "
                                 f"see {self.logfile}:\n" + self.logfile.read_text()[-3000:])
            try:
                if request(self.port, "GET", path, timeout=2)[0] == 200:
                    return
            except OSError:
                pass  # not listening yet: poll again
            time.sleep(0.25)
        raise SystemExit(f"error: {self.name} not ready on {path} within {timeout:.0f}s; see {self.logfile}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)  # its own session: the group is ours alone
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise RuntimeError("no VmRSS")


def start(name: str, cmd: list[str], env: dict[str, str], logfile: Path, ready_path: str, port: int) -> Server:
    log(f"=== starting {name}: {' '.join(cmd)}")
    with open(logfile, "ab") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                cwd=logfile.parent)
    server = Server(name, proc, port, logfile, cmd, env, ready_path)
    try:
        server.wait(ready_path, 300)
    except BaseException:
        server.stop()
        raise
    return server


@contextmanager
def temper_server(bundle: Path, base: Path, grpc: bool) -> Iterator[Server]:
    """`temper serve BUNDLE`, with `--grpc-port` when `grpc`: one process, one batcher behind both ports."""
    port = free_port()
    cmd = [str(BIN / "temper"), "serve", str(bundle), "--port", str(port)]
    grpc_port = free_port() if grpc else None
    if grpc_port is not None:
        cmd += ["--grpc-port", str(grpc_port)]
    server = start("temper serve", cmd, child_env(), base / f"temper-serve-{bundle.name}.log",
                   "/v2/health/ready", port)
    server.grpc_port = grpc_port  # the REST readiness covers it: both ports share the runtime's warm-up
    try:
        yield server
    finally:
        server.stop()


@contextmanager
def mlflow_server(model: Model, base: Path) -> Iterator[Server]:
    """Log the ONNX file with the plain mlflow.onnx flavour into a fresh sqlite store and serve version 1."""
    store = base / f"mlflow-{model.key}"
    if store.exists():
        shutil.rmtree(store)
    store.mkdir(parents=True)
    uri = f"sqlite:///{store / 'mlflow.db'}"
    script = f"""
import mlflow, mlflow.onnx, numpy as np, onnx, onnxruntime as ort
from mlflow.models import infer_signature
mlflow.set_tracking_uri({uri!r})
experiment = mlflow.create_experiment("serving-bench", artifact_location={(store / 'artifacts').as_uri()!r})
sample = np.load({str(store / 'sample.npy')!r})
session = ort.InferenceSession({str(model.path)!r}, providers=["CPUExecutionProvider"])
out = session.run(None, {{{model.input_name!r}: sample}})
with mlflow.start_run(experiment_id=experiment):
    mlflow.onnx.log_model(onnx.load({str(model.path)!r}), name="model", registered_model_name={model.key!r},
                          signature=infer_signature({{{model.input_name!r}: sample}}, {{"logits": out[0]}}))
"""
    np.save(store / "sample.npy", model.sample)
    env = child_env(MLFLOW_TRACKING_URI=uri, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    log(f"=== logging {model.path} with mlflow.onnx into {uri}")
    subprocess.run([sys.executable, "-c", script], env=env, cwd=store, check=True, stdout=sys.stderr, stderr=sys.stderr)
    port = free_port()
    server = start("mlflow models serve", [str(BIN / "mlflow"), "models", "serve", "-m", f"models:/{model.key}/1",
                                           "--env-manager", "local", "-p", str(port), "--host", "127.0.0.1"],
                   env, store / "serve.log", "/ping", port)
    try:
        yield server
    finally:
        server.stop()


@contextmanager
def plain_server(model: Model, base: Path) -> Iterator[Server]:
    """The plain one-request-per-call server (serving.py's --plain-server role) in its own process."""
    port = free_port()
    server = start("plain server", [sys.executable, str(SCRIPT), "--plain-server", str(model.path), model.key,
                                    str(port)], child_env(), base / f"plain-server-{model.key}.log",
                   "/v2/health/ready", port)
    try:
        yield server
    finally:
        server.stop()


def plain_server_main(argv: list[str]) -> int:
    """`serving.py --plain-server MODEL.onnx NAME PORT`: serve MODEL with one session.run per request.

    The baseline for what temper's runtime costs or gains a lone client. It uses temper's HTTP stack
    (uvicorn with httptools and uvloop, a bare ASGI app, no access log) so that the difference at one
    client is the runtime: batcher hand-offs, request checks, session settings. The session has
    intra-op threads = usable cores and ORT's other defaults (spinning on), as a hand-written server
    would. It runs on the event loop, one request at a time, and checks nothing beyond what numpy
    needs to read the body: a Triton binary-extension body gets a binary answer, a KServe v2 JSON
    body a JSON one. Single-input, single-output models only (both models here).
    """
    import onnxruntime as ort
    import uvicorn

    path, name, port = argv[0], argv[1], int(argv[2])
    options = ort.SessionOptions()
    options.intra_op_num_threads = len(os.sched_getaffinity(0))
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    input_name, output_name = session.get_inputs()[0].name, session.get_outputs()[0].name

    def infer(headers: dict[bytes, bytes], body: bytes) -> tuple[list[tuple[bytes, bytes]], bytes]:
        head_size = headers.get(b"inference-header-content-length")
        if head_size is not None:
            n = int(head_size)
            shape = json.loads(body[:n])["inputs"][0]["shape"]
            array = np.frombuffer(body[n:], dtype="<f4").reshape(shape)
        else:
            tensor = json.loads(body)["inputs"][0]
            array = np.asarray(tensor["data"], dtype=np.float32).reshape(tensor["shape"])
        out = session.run([output_name], {input_name: array})[0]
        if head_size is None:
            reply = {"model_name": name, "outputs": [{"name": output_name, "datatype": "FP32", "shape": list(out.shape),
                                                      "data": out.ravel().tolist()}]}
            return [(b"content-type", b"application/json")], json.dumps(reply, separators=(",", ":")).encode()
        data = np.ascontiguousarray(out, dtype="<f4").tobytes()
        head = json.dumps({"model_name": name, "outputs": [{"name": output_name, "datatype": "FP32",
                                                             "shape": list(out.shape),
                                                             "parameters": {"binary_data_size": len(data)}}]},
                          separators=(",", ":")).encode()
        return [(b"content-type", b"application/octet-stream"),
                (b"inference-header-content-length", str(len(head)).encode())], head + data

    async def app(scope: dict[str, Any], receive: Callable[[], Any], send: Callable[[dict[str, Any]], Any]) -> None:
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        if scope["method"] == "GET":  # readiness: the session is loaded before uvicorn listens
            headers, payload = [(b"content-type", b"text/plain")], b"ready"
        else:
            headers, payload = infer(dict(scope["headers"]), body)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [*headers, (b"content-length", str(len(payload)).encode())]})
        await send({"type": "http.response.body", "body": payload})

    uvicorn.run(app, host="127.0.0.1", port=port, loop="uvloop", http="httptools", lifespan="off",
                access_log=False, log_level="warning")
    return 0
