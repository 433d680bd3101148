"""Benchmark `temper serve` against `mlflow models serve`, a plain server and the raw ONNX Runtime ceiling.

    .venv/bin/python benchmarks/serving.py [--out-base DIR] [--duration S] [--concurrency 1,8,32,64] ...

Two models: the digits CNN (built by `temper run recipes/digits-cnn.yaml`, its FP32 baseline) and a
heavier seeded ResNet-ish CNN at 1x3x64x64 that takes a few ms per batch-1 inference here. Per model:

  (c)  in-process ONNX Runtime, no HTTP, at batch 1, 8, 16, 32: samples/s. Measured before and after
       the HTTP points; the higher of the two is the ceiling (the stricter denominator).
  (a)  `temper serve --grpc-port` on a bundle (artifacts.bundle.config_for/write), the load generator
       sending Triton's binary tensor extension; (a-json) the same server with a plain KServe v2 JSON
       body; (a-grpc) the same server's gRPC port, ModelInfer with raw_input_contents.
  (p)  a plain server: the same HTTP stack (uvicorn, httptools, uvloop, a bare ASGI app) running one
       session.run per request, no batcher, taking the same binary and JSON bodies as (a): what the
       batcher costs or gains a lone client (--plain-concurrency, 1 by default).
  (b)  `mlflow models serve --env-manager local` on the same ONNX file logged with mlflow.onnx
       (a temp sqlite store), with mlflow's `{"inputs": {name: nested list}}` tensor body.

Load: HTTP with wrk (Debian package `wrk`), one thread, -c CONCURRENCY closed-loop connections on
127.0.0.1; gRPC with a Python grpc.aio client in its own process (one channel, CONCURRENCY calls in
flight, each reissuing a pre-built request as soon as its answer is in). Each point is bounded by
--duration seconds and --max-requests responses. Every req/s figure is also given as a ratio to (c)
at batch = the bundle's max_batch_size. The average formed batch comes from the server's /metrics
(nv_inference_count / nv_inference_exec_count deltas over the point). Finally the temper server's
VmRSS is read before and after --rss-requests requests at concurrency 32, twice.

Markdown goes to stdout (the host first, as artifacts.host.profile().summary() gives it); progress
and server logs to stderr / files under the output base.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import http.client
import importlib.metadata
import json
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Self

import numpy as np

SCRIPT = Path(__file__).resolve()
ROOT = SCRIPT.parent.parent
sys.path.insert(0, str(ROOT))
BIN = Path(sys.executable).parent
DIGITS_RECIPE = ROOT / "recipes" / "digits-cnn.yaml"
CEILING_BATCHES = (1, 8, 16, 32)
SEED = 0
HEAVY_WIDTH = 32  # channels of the heavy CNN's first stage: ~3 ms per batch-1 inference on a quiet 2-core EPYC VM
CLIENT_TIMEOUT_S = 10  # per request, both load generators (wrk --timeout)


def log(*parts: object) -> None:
    print(*parts, file=sys.stderr, flush=True)


def child_env(**extra: str) -> dict[str, str]:
    """The environment for the processes this script starts: this checkout first on PYTHONPATH, so that
    `temper run`, `temper serve` and the helper roles run the code beside this script, not whatever the
    venv's (editable) install points at."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, **extra}


# -- machine ---------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    return {
        "cpu": cpu,
        "cores": len(os.sched_getaffinity(0)),
        "ort": importlib.metadata.version("onnxruntime"),
        "mlflow": importlib.metadata.version("mlflow"),
        "python": platform.python_version(),
        "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
    }


def wait_for_quiet(threshold: float, max_wait: float) -> tuple[float, float, float]:
    """Wait (up to max_wait s) for the 1-minute load average to drop below threshold.
    Returns (load when asked, load when starting, seconds waited)."""
    first = os.getloadavg()[0]
    began = time.monotonic()
    load = first
    while load > threshold and time.monotonic() - began < max_wait:
        log(f"load average {load:.2f} > {threshold}: waiting ({time.monotonic() - began:.0f}/{max_wait:.0f} s)")
        time.sleep(min(15, max_wait))
        load = os.getloadavg()[0]
    return first, load, time.monotonic() - began


def top_processes(n: int = 3, window: float = 2.0) -> str:
    """The busiest processes over the next `window` seconds (CPU% from /proc deltas), for the load note."""
    def ticks() -> dict[int, tuple[str, int]]:
        seen = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                text = stat.read_text()
            except OSError:
                continue
            comm = text[text.index("(") + 1:text.rindex(")")]
            fields = text[text.rindex(")") + 2:].split()
            seen[int(stat.parent.name)] = (comm, int(fields[11]) + int(fields[12]))  # utime + stime
        return seen

    first = ticks()
    time.sleep(window)
    hz = os.sysconf("SC_CLK_TCK")
    busy = sorted(((t - first[pid][1]) / hz / window * 100, comm) for pid, (comm, t) in ticks().items() if pid in first)
    shown = [f"{comm} {pct:.0f}%" for pct, comm in reversed(busy[-n:]) if pct >= 5]
    return ", ".join(shown) or "none above 5% CPU"


# -- models ----------------------------------------------------------------------------------


@dataclass
class Model:
    key: str
    path: Path
    input_name: str
    sample: np.ndarray  # one row, float32, batch dim 1
    json_values: list  # the same values as the nested list a JSON client sends (4 decimals)
    note: str = ""
    batch1_ms: float | None = None


def rounded_sample(shape: tuple[int, ...], scale: float) -> tuple[np.ndarray, list]:
    """Seeded random input with 4 decimals, so the JSON and binary bodies carry the same values."""
    values = np.round(np.random.default_rng(SEED).random(shape) * scale, 4)
    return values.astype(np.float32), values.tolist()


def build_digits(base: Path) -> Model:
    out = base / "digits"
    model = out / "baseline" / "model.onnx"
    if not model.is_file():
        log(f"=== building the digits CNN: temper run {DIGITS_RECIPE} --output {out}")
        env = child_env(TEMPER_CACHE_DIR=str(base / "cache"),
                        MLFLOW_TRACKING_URI=f"sqlite:///{base / 'temper-run-mlflow.db'}")
        rc = subprocess.run([str(BIN / "temper"), "run", str(DIGITS_RECIPE), "--output", str(out)], cwd=base, env=env,
                            stdout=sys.stderr, stderr=sys.stderr, check=False).returncode
        if not model.is_file():
            raise SystemExit(f"error: temper run exited {rc} without {model}")
    sample, values = rounded_sample((1, 1, 8, 8), 16.0)
    return Model("digits", model, _input_name(model), sample, values,
                 "digits CNN (recipes/digits-cnn.yaml FP32 baseline), 1x1x8x8")


def build_heavy(base: Path) -> Model:
    """A seeded ResNet-ish CNN (4 residual stages, widths 32-256) at 1x3x64x64, batch dim symbolic."""
    w = HEAVY_WIDTH
    path = base / f"heavy-w{w}" / "model.onnx"
    if not path.is_file():
        import torch
        from torch import nn

        class Block(nn.Module):
            def __init__(self, cin: int, cout: int, stride: int) -> None:
                super().__init__()
                self.c1, self.b1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout)
                self.c2, self.b2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
                self.skip = (nn.Identity() if stride == 1 and cin == cout
                             else nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)))

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return torch.relu(self.b2(self.c2(torch.relu(self.b1(self.c1(x))))) + self.skip(x))

        torch.manual_seed(SEED)
        net = nn.Sequential(nn.Conv2d(3, w, 3, 1, 1, bias=False), nn.BatchNorm2d(w), nn.ReLU(),
                            Block(w, w, 1), Block(w, 2 * w, 2), Block(2 * w, 4 * w, 2), Block(4 * w, 8 * w, 2),
                            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8 * w, 10)).eval()
        path.parent.mkdir(parents=True, exist_ok=True)
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(net, torch.zeros(1, 3, 64, 64), str(path), input_names=["image"],
                              output_names=["logits"], dynamic_axes={"image": {0: "batch"}, "logits": {0: "batch"}},
                              opset_version=17, dynamo=False)
    sample, values = rounded_sample((1, 3, 64, 64), 1.0)
    return Model("heavy", path, "image", sample, values,
                 f"ResNet-ish CNN, 4 residual stages ({w}-{8 * w} channels), 1x3x64x64, seeded random weights")


def _input_name(path: Path) -> str:
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    initializers = {i.name for i in graph.initializer}
    return next(v.name for v in graph.input if v.name not in initializers)


def make_bundle(model: Model, dest: Path, max_batch: int, max_delay_ms: float) -> Path:
    from temper.artifacts import bundle

    if dest.exists():
        shutil.rmtree(dest)
    config = bundle.config_for(model.path, model.key, max_batch_size=max_batch, max_delay_ms=max_delay_ms)
    return bundle.write(dest, model.path, config)


# -- (c): the raw ONNX Runtime ceiling -------------------------------------------------------


def ceiling(model: Model, duration: float, batches: tuple[int, ...] = CEILING_BATCHES) -> dict[str, dict[int, float]]:
    """Samples/s of one in-process session (intra_op threads = cores) per batch size, with ORT's default
    spinning intra-op threads ("spin") and with spinning off as temper's runtime sets it ("no spin")."""
    import onnxruntime as ort

    result: dict[str, dict[int, float]] = {}
    for label, spinning in (("spin", "1"), ("no spin", "0")):
        options = ort.SessionOptions()
        options.intra_op_num_threads = len(os.sched_getaffinity(0))
        options.add_session_config_entry("session.intra_op.allow_spinning", spinning)
        session = ort.InferenceSession(str(model.path), options, providers=["CPUExecutionProvider"])
        result[label] = {}
        for batch in batches:
            feed = {model.input_name: np.repeat(model.sample, batch, axis=0)}
            for _ in range(5):
                session.run(None, feed)
            runs, began = 0, time.perf_counter()
            while (elapsed := time.perf_counter() - began) < duration:
                session.run(None, feed)
                runs += 1
            result[label][batch] = runs * batch / elapsed
        del session
    return result


def best(measures: list[dict[str, dict[int, float]]]) -> dict[int, float]:
    return {b: max(m[label][b] for m in measures for label in m) for b in CEILING_BATCHES}


class CpuMeter:
    """CPU used while it was open by every process except this script, the children it waited for
    (wrk) and the process trees under `roots` (the server being measured), in % of one core (200% =
    both cores of a 2-core machine): other work competing with the measurement, the idle server of
    the other kind included."""

    def __init__(self, roots: tuple[int, ...] = ()) -> None:
        self.roots = roots

    def __enter__(self) -> Self:
        self.began, self.busy, self.ours = time.monotonic(), _busy_ticks(), _our_ticks(self.roots)
        return self

    def __exit__(self, *exc: object) -> None:
        wall = time.monotonic() - self.began
        others = (_busy_ticks() - self.busy) - (_our_ticks(self.roots) - self.ours)
        self.percent = max(0.0, others / os.sysconf("SC_CLK_TCK") / wall * 100) if wall else 0.0


def _busy_ticks() -> int:
    first_line = Path("/proc/stat").read_text().split("\n", 1)[0]
    user, nice, system, _idle, _iowait, irq, softirq = map(int, first_line.split()[1:8])
    return user + nice + system + irq + softirq


def _our_ticks(roots: tuple[int, ...]) -> int:
    """utime+stime of this process and the children it waited for, plus the process trees under `roots`."""
    parents, ticks = {}, {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2:].split()
        pid = int(stat.parent.name)
        parents[pid] = int(fields[1])
        children = int(fields[13]) + int(fields[14]) if pid == os.getpid() else 0  # cutime + cstime: reaped ones
        ticks[pid] = int(fields[11]) + int(fields[12]) + children
    total = ticks.get(os.getpid(), 0)
    for pid, used in ticks.items():
        p = pid
        while p > 1 and p not in roots:
            p = parents.get(p, 0)
        if p in roots:
            total += used
    return total


def reference(model: Model) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(str(model.path), providers=["CPUExecutionProvider"])
    return session.run(None, {model.input_name: model.sample})[0]


def wait_quiet(max_wait: float, limit: float = 10.0) -> float:
    """Wait up to max_wait s until processes outside the benchmark use under `limit`% CPU over 2 s;
    the seconds waited."""
    began = time.monotonic()
    while True:
        with CpuMeter() as meter:
            time.sleep(2)
        waited = time.monotonic() - began
        if meter.percent < limit or waited >= max_wait:
            return waited
        log(f"  other processes use {meter.percent:.0f}% CPU: waiting ({waited:.0f}/{max_wait:.0f} s)")


# -- servers ---------------------------------------------------------------------------------


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
    """The plain one-request-per-call server (this script's --plain-server role) in its own process."""
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


# -- request bodies --------------------------------------------------------------------------


@dataclass
class Body:
    label: str
    path: str  # URL path
    payload: bytes
    headers: dict[str, str]


def temper_binary_body(model: Model) -> Body:
    data = np.ascontiguousarray(model.sample, dtype="<f4").tobytes()
    head = json.dumps({"inputs": [{"name": model.input_name, "shape": list(model.sample.shape), "datatype": "FP32",
                                   "parameters": {"binary_data_size": len(data)}}],
                       "parameters": {"binary_data_output": True}}, separators=(",", ":")).encode()
    return Body("binary", f"/v2/models/{model.key}/infer", head + data,
                {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(head))})


def temper_json_body(model: Model) -> Body:
    flat = np.asarray(model.json_values).ravel().tolist()
    payload = json.dumps({"inputs": [{"name": model.input_name, "shape": list(model.sample.shape), "datatype": "FP32",
                                      "data": flat}]}, separators=(",", ":")).encode()
    return Body("json", f"/v2/models/{model.key}/infer", payload, {"Content-Type": "application/json"})


def mlflow_body(model: Model) -> Body:
    payload = json.dumps({"inputs": {model.input_name: model.json_values}}, separators=(",", ":")).encode()
    return Body("json", "/invocations", payload, {"Content-Type": "application/json"})


def check(server: Server, body: Body, expected: np.ndarray) -> None:
    """One request through the server; its logits must match in-process ORT."""
    status, headers, raw = request(server.port, "POST", body.path, body.payload, body.headers)
    if status != 200:
        raise SystemExit(f"error: {server.name} answered {status}: {raw[:500]!r}")
    if "inference-header-content-length" in headers:
        n = int(headers["inference-header-content-length"])
        head = json.loads(raw[:n])
        got = np.frombuffer(raw[n:], dtype="<f4").reshape(head["outputs"][0]["shape"])
    else:
        reply = json.loads(raw)
        if "outputs" in reply:
            got = np.asarray(reply["outputs"][0]["data"], dtype=np.float32).reshape(reply["outputs"][0]["shape"])
        else:  # mlflow: {"predictions": {"logits": [[...]]}}
            predictions = reply["predictions"]
            got = np.asarray(predictions["logits"] if isinstance(predictions, dict) else predictions, dtype=np.float32)
    if not np.allclose(got.reshape(expected.shape), expected, rtol=1e-3, atol=1e-4):
        raise SystemExit(f"error: {server.name} ({body.label}) returned {got.ravel()[:5]}, "
                         f"expected {expected.ravel()[:5]}")


# -- load generator --------------------------------------------------------------------------

LUA = """\
local f = assert(io.open({body!r}, "rb"))
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
{headers}
local n = 0
function response(status, headers, body)
  n = n + 1
  if n == {cap} then io.write("LIMIT\\n"); io.flush(); wrk.thread:stop() end
end
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('RESULT {{"requests":%d,"duration_us":%d,"connect":%d,"read":%d,"write":%d,"status":%d,' ..
    '"timeout":%d,"p50_us":%d,"p99_us":%d}}\\n', summary.requests, summary.duration, e.connect, e.read, e.write,
    e.status, e.timeout, latency:percentile(50), latency:percentile(99)))
end
"""


@dataclass
class Point:
    requests: int
    seconds: float
    p50_ms: float
    p99_ms: float
    errors: int
    error_kinds: dict[str, int] = field(default_factory=dict)
    avg_batch: float | None = None
    background: float = 0.0  # % of one core used by processes outside the benchmark during the point

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0


def wrk(port: int, body: Body, concurrency: int, duration: float, cap: int, workdir: Path) -> Point:
    """One closed-loop wrk run: `concurrency` connections, one thread, until `duration` s or `cap` responses."""
    body_file = workdir / f"body-{port}-{body.label}.bin"
    body_file.write_bytes(body.payload)
    script = workdir / f"wrk-{port}-{body.label}.lua"
    headers = "\n".join(f"wrk.headers[{k!r}] = {v!r}" for k, v in body.headers.items())
    script.write_text(LUA.format(body=str(body_file), headers=headers, cap=cap))
    cmd = ["wrk", "-t1", f"-c{concurrency}", f"-d{max(1, round(duration))}s", "--timeout", f"{CLIENT_TIMEOUT_S}s",
           "--latency", "-s", str(script), f"http://127.0.0.1:{port}{body.path}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    result, lines = None, []
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            lines.append(line)
            if line.strip() == "LIMIT":
                proc.send_signal(signal.SIGINT)  # wrk then reports on the time actually elapsed
            elif line.startswith("RESULT "):
                result = json.loads(line[len("RESULT "):])
        proc.wait()
    finally:  # interrupted or failed here: stop this wrk, by its PID, before anything else
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if result is None:
        raise SystemExit("error: wrk gave no result:\n" + "".join(lines))
    kinds = {k: result[k] for k in ("connect", "read", "write", "status", "timeout") if result[k]}
    return Point(result["requests"], result["duration_us"] / 1e6, result["p50_us"] / 1e3, result["p99_us"] / 1e3,
                 sum(kinds.values()), kinds)


def grpc_load(port: int, model: Model, expected: np.ndarray, concurrency: int, duration: float, cap: int,
              workdir: Path) -> Point:
    """One closed-loop gRPC point, run by this script's --grpc-load role in a process of its own: the
    client's Python and gRPC threads then neither share this process's GIL nor hide in its CPU time
    (the CPU meter counts it as the load generator's, like wrk's)."""
    np.save(workdir / f"grpc-{model.key}-sample.npy", model.sample)
    np.save(workdir / f"grpc-{model.key}-expected.npy", expected)
    spec = {"port": port, "model": model.key, "input": model.input_name, "concurrency": concurrency,
            "duration": duration, "cap": cap, "sample": str(workdir / f"grpc-{model.key}-sample.npy"),
            "expected": str(workdir / f"grpc-{model.key}-expected.npy")}
    spec_file = workdir / f"grpc-{port}.json"
    spec_file.write_text(json.dumps(spec))
    proc = subprocess.run([sys.executable, str(SCRIPT), "--grpc-load", str(spec_file)],
                          capture_output=True, text=True, env=child_env(),
                          timeout=duration + CLIENT_TIMEOUT_S + 120, check=False)  # kills it on any error
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise SystemExit(f"error: the gRPC load generator exited {proc.returncode}:\n"
                         f"{proc.stdout}{proc.stderr[-3000:]}")
    result = json.loads(lines[-1][len("RESULT "):])
    if "mismatch" in result:
        raise SystemExit(f"error: temper serve (gRPC) returned {result['mismatch']}, expected {expected.ravel()[:5]}")
    return Point(result["requests"], result["seconds"], result["p50_ms"], result["p99_ms"],
                 sum(result["errors"].values()), result["errors"])


def grpc_load_main(argv: list[str]) -> int:
    """`serving.py --grpc-load SPEC.json`: one point (see grpc_load); prints `RESULT {json}`."""
    spec = json.loads(Path(argv[0]).read_text())
    print("RESULT " + json.dumps(asyncio.run(_grpc_drive(spec))), flush=True)
    return 0


async def _grpc_drive(spec: dict[str, Any]) -> dict[str, Any]:
    """`concurrency` tasks on one channel, each sending the same pre-built ModelInferRequest (raw little-endian
    input bytes, as perf_analyzer and tritonclient send them) again as soon as its answer is in, until the
    duration is up or `cap` requests were sent. The first answer must match in-process ONNX Runtime."""
    import grpc
    from tritonclient.grpc import service_pb2 as pb
    from tritonclient.grpc import service_pb2_grpc as pb_grpc

    sample, expected = np.load(spec["sample"]), np.load(spec["expected"])
    request = pb.ModelInferRequest(model_name=spec["model"])
    request.inputs.add(name=spec["input"], datatype="FP32", shape=list(sample.shape))
    request.raw_input_contents.append(np.ascontiguousarray(sample, dtype="<f4").tobytes())
    latencies: list[int] = []
    errors: Counter[str] = Counter()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{spec['port']}") as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        reply = await stub.ModelInfer(request, timeout=30)
        got = np.frombuffer(reply.raw_output_contents[0], dtype="<f4")
        if got.size != expected.size or not np.allclose(got.reshape(expected.shape), expected, rtol=1e-3, atol=1e-4):
            return {"mismatch": got.ravel()[:5].tolist()}
        sent, deadline = 0, time.monotonic() + spec["duration"]

        async def client() -> None:
            nonlocal sent
            while sent < spec["cap"] and time.monotonic() < deadline:
                sent += 1
                began = time.perf_counter_ns()
                try:
                    await stub.ModelInfer(request, timeout=CLIENT_TIMEOUT_S)
                except grpc.aio.AioRpcError as exc:
                    errors[exc.code().name] += 1
                    continue
                latencies.append(time.perf_counter_ns() - began)

        began = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(spec["concurrency"])))
        seconds = time.perf_counter() - began
    ms = np.asarray(latencies, dtype=np.float64) / 1e6
    p50, p99 = np.percentile(ms, [50, 99]).tolist() if ms.size else [float("nan")] * 2
    return {"requests": len(latencies) + sum(errors.values()), "seconds": seconds, "p50_ms": p50, "p99_ms": p99,
            "errors": dict(errors)}


def metrics(port: int) -> dict[str, float]:
    _, _, raw = request(port, "GET", "/metrics")
    values = {}
    for line in raw.decode().splitlines():
        match = re.match(r"^(nv_\w+)\{[^}]*\} (\S+)$", line)
        if match:
            values[match.group(1)] = float(match.group(2))
    return values


def measured(server: Server, label: str, concurrency: int, load: Callable[[], Point], with_metrics: bool) -> Point:
    """One point of `load` against `server` (restarted first if it went away), with the CPU other processes
    used meanwhile and, for temper, the average batch the runtime formed."""
    server.ensure()
    before = metrics(server.port) if with_metrics else None
    with CpuMeter((server.proc.pid,)) as meter:
        point = load()
    point.background = meter.percent
    if before is not None:
        after = metrics(server.port)
        executions = after["nv_inference_exec_count"] - before["nv_inference_exec_count"]
        if executions:
            point.avg_batch = (after["nv_inference_count"] - before["nv_inference_count"]) / executions
    log(f"  {server.name} [{label}] c={concurrency}: {point.rps:,.0f} req/s p50 {point.p50_ms:.2f} ms "
        f"p99 {point.p99_ms:.2f} ms errors {point.errors}"
        + (f" avg batch {point.avg_batch:.2f}" if point.avg_batch else "")
        + f" (background CPU {point.background:.0f}%)")
    return point


# -- one model -------------------------------------------------------------------------------


@dataclass
class ModelResult:
    model: Model
    bundle_max_batch: int
    ceiling_before: dict[str, dict[int, float]]
    ceiling_after: dict[str, dict[int, float]] = field(default_factory=dict)
    ceiling_background: list[float] = field(default_factory=list)
    retried: int = 0
    restarts: dict[str, int] = field(default_factory=dict)
    adjacent: dict[int, float] = field(default_factory=dict)  # (c) at max_batch measured just before each concurrency
    rows: dict[tuple[str, int], Point] = field(default_factory=dict)
    rss: list[tuple[str, int, Point | None]] = field(default_factory=list)
    load: list[float] = field(default_factory=list)

    @property
    def ceiling(self) -> dict[int, float]:
        return best([self.ceiling_before, self.ceiling_after] if self.ceiling_after else [self.ceiling_before])

    @property
    def denominator(self) -> float:
        """The best (c) at max_batch_size seen anywhere in the run: before, after, or next to a concurrency."""
        return max([self.ceiling[self.bundle_max_batch], *self.adjacent.values()])


def bench_model(model: Model, args: argparse.Namespace, base: Path, rss_check: bool) -> ModelResult:
    log(f"=== {model.key}: (c) ONNX Runtime ceiling, {args.ceiling_duration:g} s per batch size")
    wait_quiet(args.max_wait)
    with CpuMeter() as meter:
        result = ModelResult(model, args.max_batch, ceiling(model, args.ceiling_duration))
    result.ceiling_background.append(meter.percent)
    model.batch1_ms = 1000 / best([result.ceiling_before])[1]
    log(f"  {result.ceiling_before} (background CPU {meter.percent:.0f}%)")
    bundle = make_bundle(model, base / "bundles" / model.key, args.max_batch, args.max_delay_ms)
    expected = reference(model)
    workdir = base / "wrk"
    workdir.mkdir(exist_ok=True)
    binary, v2_json, mlflow_json = temper_binary_body(model), temper_json_body(model), mlflow_body(model)
    grpc = not args.no_grpc

    def http(server: Server, body: Body, concurrency: int) -> Point:
        return measured(server, body.label, concurrency,
                        lambda: wrk(server.port, body, concurrency, args.duration, args.max_requests, workdir),
                        server is temper)

    with ExitStack() as stack:
        temper = stack.enter_context(temper_server(bundle, base, grpc))
        mlflow = stack.enter_context(mlflow_server(model, base))
        simple = stack.enter_context(plain_server(model, base)) if args.plain_concurrency else None
        grpc_port = temper.grpc_port
        result.rss.append(("after start (warm-up only)", temper.rss_kib(), None))
        check(temper, binary, expected)
        check(temper, v2_json, expected)
        check(mlflow, mlflow_json, expected)
        warm = [(temper, binary), (mlflow, mlflow_json)]
        if simple is not None:
            check(simple, binary, expected)
            check(simple, v2_json, expected)
            warm.append((simple, binary))
        for server, body in warm:  # warm every path, results dropped
            wrk(server.port, body, 8, 2, args.max_requests, workdir)
        if grpc_port is not None:  # checks the gRPC answer too
            grpc_load(grpc_port, model, expected, 8, 2, args.max_requests, workdir)
        for concurrency in args.concurrency:  # interleaved, so drifting background load hits every column alike
            for attempt in (1, 2):  # a point that other work competed with is measured once more
                wait_quiet(args.max_wait)
                result.load.append(os.getloadavg()[0])
                # (c) right before the points too: the machine's speed drifts over minutes (other VMs,
                # clocks) in ways no process here shows, and this one saw what the points saw.
                with CpuMeter() as meter:
                    near = ceiling(model, args.adjacent_duration, (args.max_batch,))
                result.adjacent[concurrency] = max(v[args.max_batch] for v in near.values())
                rows = {"a": http(temper, binary, concurrency)}
                if not args.no_json_rows:
                    rows["a-json"] = http(temper, v2_json, concurrency)
                if grpc_port is not None:
                    load = partial(grpc_load, grpc_port, model, expected, concurrency, args.duration,
                                   args.max_requests, workdir)
                    rows["a-grpc"] = measured(temper, "grpc", concurrency, load, True)
                if simple is not None and concurrency in args.plain_concurrency:
                    rows["p"] = http(simple, binary, concurrency)
                    if not args.no_json_rows:
                        rows["p-json"] = http(simple, v2_json, concurrency)
                rows["b"] = http(mlflow, mlflow_json, concurrency)
                noisy = max(p.background for p in rows.values())
                if noisy < args.noisy or attempt == 2:
                    break
                result.load.pop()
                log(f"  other processes used up to {noisy:.0f}% CPU during these points: "
                    f"measuring {concurrency} clients again")
            result.retried += attempt == 2
            for kind, point in rows.items():
                result.rows[(kind, concurrency)] = point
        result.restarts = {srv.name: srv.restarts for srv in (temper, mlflow, simple) if srv is not None}
        for other in (mlflow, simple):  # the RSS runs have the machine to themselves
            if other is not None:
                other.stop()
        if rss_check:
            result.rss.append(("after the benchmark points", temper.rss_kib(), None))
            for i in (1, 2):
                wait_quiet(args.max_wait)
                log(f"=== {model.key}: RSS check, run {i}: {args.rss_requests:,} requests at concurrency 32")
                point = wrk(temper.port, binary, 32, args.rss_timeout, args.rss_requests, workdir)
                result.rss.append((f"after {i * args.rss_requests // 1000}k more requests", temper.rss_kib(), point))
                log(f"  {point.requests:,} requests in {point.seconds:.1f} s, errors {point.errors}, "
                    f"VmRSS {result.rss[-1][1]:,} KiB")
    log(f"=== {model.key}: (c) again")
    wait_quiet(args.max_wait)
    with CpuMeter() as meter:
        result.ceiling_after = ceiling(model, args.ceiling_duration)
    result.ceiling_background.append(meter.percent)
    model.batch1_ms = 1000 / result.ceiling[1]
    log(f"  {result.ceiling_after} (background CPU {meter.percent:.0f}%)")
    return result


# -- report ----------------------------------------------------------------------------------

LABELS = {"a": "(a) temper serve, binary", "a-json": "(a) temper serve, JSON", "a-grpc": "(a) temper serve, gRPC",
          "p": "(p) plain server, binary", "p-json": "(p) plain server, JSON", "b": "(b) mlflow models serve"}


def ratio(x: float, y: float) -> str:
    return f"{x / y:.2f}x" if y else ""


def table(result: ModelResult) -> str:
    m = result.model
    denom = result.denominator
    near_values = ", ".join(f"{c} clients {v:,.0f}" for c, v in result.adjacent.items())
    lines = [f"### {m.key}: {m.note}", "",
             f"Batch-1 ONNX Runtime latency {m.batch1_ms:.3f} ms. Bundle: max_batch_size {result.bundle_max_batch}, "
             f"max_delay_ms {ARGS.max_delay_ms:g}. Ratios are to (c) at batch {result.bundle_max_batch} = "
             f"{denom:,.0f} samples/s, the best (c) at that batch anywhere in this run. `x (c) near`: ratio to (c) "
             f"at batch {result.bundle_max_batch} measured right before that concurrency's points ({near_values} "
             "samples/s), which saw the same machine speed as the points. `x (b)`: req/s over (b)'s at the same "
             "concurrency. `bg CPU`: CPU used during the point by every process but the server measured and the "
             "load generator (the other, idle servers included; % of one core; above ~10% means other work "
             "competed with the measurement).", "",
             "| server | clients | req/s | ratio to (c) | x (c) near | x (b) | p50 ms | p99 ms | errors | avg batch "
             "| bg CPU |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for kind in LABELS:
        for c in ARGS.concurrency:
            p = result.rows.get((kind, c))
            if p is None:
                continue
            vs_b = ratio(p.rps, result.rows[("b", c)].rps) if kind != "b" else ""
            errors = str(p.errors) + (f" ({', '.join(f'{k} {v}' for k, v in p.error_kinds.items())})"
                                      if p.errors else "")
            batch = f"{p.avg_batch:.2f}" if p.avg_batch is not None else ""
            near = ratio(p.rps, result.adjacent[c]) if result.adjacent.get(c) else ""
            lines.append(f"| {LABELS[kind]} | {c} | {p.rps:,.0f} | {p.rps / denom:.2f}x | {near} | {vs_b} | "
                         f"{p.p50_ms:.2f} | {p.p99_ms:.2f} | {errors} | {batch} | {p.background:.0f}% |")
    lone = lone_client(result)
    if lone:
        lines += ["", "One client, p50: " + lone + "."]
    bg = " / ".join(f"{x:.0f}%" for x in result.ceiling_background)
    lines += ["", (f"(c) in-process ONNX Runtime, {machine_info['cores']} intra-op threads, no HTTP, samples/s; "
                   "ORT's default spinning intra-op threads and spinning off (as temper's runtime runs), each before "
                   f"and after the HTTP points (bg CPU {bg}); the ceiling is the best of the four:"), "",
              "| batch | spin, before | no spin, before | spin, after | no spin, after | ceiling |",
              "|---:|---:|---:|---:|---:|---:|"]
    for b in CEILING_BATCHES:
        mark = " **(denominator)**" if b == result.bundle_max_batch else ""
        cells = " | ".join(f"{m[label][b]:,.0f}" for m in (result.ceiling_before, result.ceiling_after)
                           for label in ("spin", "no spin"))
        lines.append(f"| {b}{mark} | {cells} | {result.ceiling[b]:,.0f} |")
    if result.rss:
        lines += ["", "RSS of the temper server (VmRSS):", ""]
        first = result.rss[0][1]
        for label, kib, point in result.rss:
            extra = (f" ({point.requests:,} requests in {point.seconds:.0f} s = {point.rps:,.0f} req/s, "
                     f"errors {point.errors})") if point else ""
            lines.append(f"- {label}: {kib / 1024:.1f} MiB ({(kib - first) / 1024:+.1f} MiB){extra}")
    lines += ["", "1-min load average at each concurrency's start (it counts the benchmark's own processes): "
              + ", ".join(f"{c} clients {x:.2f}" for c, x in zip(ARGS.concurrency, result.load)) + "."
              + (f" {result.retried} concurrency level(s) were measured twice because other processes used more "
                 f"than {ARGS.noisy:g}% CPU the first time; the table shows the second measurement."
                 if result.retried else "")
              + "".join(f" {name} had gone away and was restarted {n} time(s) between points."
                        for name, n in result.restarts.items() if n)]
    return "\n".join(lines)


def lone_client(result: ModelResult) -> str:
    """temper's p50 at one client beside the plain server's: what the runtime costs or gains a lone client."""
    parts = []
    for kind, plain_kind, label in (("a", "p", "binary"), ("a-json", "p-json", "JSON")):
        a, p = result.rows.get((kind, 1)), result.rows.get((plain_kind, 1))
        if a and p:
            parts.append(f"{label}: temper {a.p50_ms:.2f} ms, plain server {p.p50_ms:.2f} ms "
                         f"({a.p50_ms - p.p50_ms:+.2f} ms, {a.p50_ms / p.p50_ms:.2f}x)")
    grpc = result.rows.get(("a-grpc", 1))
    if grpc:
        parts.append(f"gRPC: temper {grpc.p50_ms:.2f} ms")
    return "; ".join(parts)


def targets(results: dict[str, ModelResult]) -> str:
    lines = ["### Targets", ""]

    def verdict(ok: bool) -> str:
        return "met" if ok else "**missed**"

    heavy = results.get("heavy")
    if heavy:
        for c in [c for c in ARGS.concurrency if c >= 32]:
            a, b = heavy.rows[("a", c)], heavy.rows[("b", c)]
            ra, rb = a.rps / heavy.denominator, a.rps / b.rps if b.rps else float("inf")
            near = a.rps / heavy.adjacent[c] if heavy.adjacent.get(c) else float("nan")
            lines.append(f"- heavy, {c} clients: temper {ra:.2f}x of (c) (target >= 0.8: {verdict(ra >= 0.8)}; "
                         f"{near:.2f}x of the (c) measured next to it), "
                         f"{rb:.2f}x of (b) (target >= 2: {verdict(rb >= 2)})")
            g = heavy.rows.get(("a-grpc", c))
            if g:
                lines.append(f"- heavy, {c} clients, gRPC (no target): temper {g.rps / heavy.denominator:.2f}x of (c), "
                             f"{g.rps / a.rps:.2f}x of its own HTTP binary figure")
    digits = results.get("digits")
    if digits:
        for c in ARGS.concurrency:
            a, b = digits.rows[("a", c)], digits.rows[("b", c)]
            rb = a.rps / b.rps if b.rps else float("inf")
            g = digits.rows.get(("a-grpc", c))
            grpc = f"; gRPC {g.rps / b.rps:.2f}x (no target)" if g and b.rps else ""
            lines.append(f"- digits, {c} clients: temper (binary) {rb:.2f}x of (b) (target >= 3: {verdict(rb >= 3)})"
                         + grpc)
    for key, result in results.items():
        lone = lone_client(result)
        if lone:
            lines.append(f"- {key}, one client, p50 against the plain server (no target): {lone}")
    for key, result in results.items():
        if len(result.rss) >= 4:
            (_, r1, _), (_, r2, _) = result.rss[-2], result.rss[-1]
            growth = (r2 - r1) / 1024
            lines.append(f"- {key}: RSS over the second {ARGS.rss_requests // 1000}k requests {growth:+.1f} MiB "
                         f"({verdict(abs(growth) < 5)}: flat means within 5 MiB)")
    return "\n".join(lines)


def summary(results: dict[str, ModelResult]) -> str:
    """The short tables the top-level README shows."""
    lines = ["### Summary", "",
             "| model | clients | HTTP binary req/s | x (c) | x (b) | p50 ms | p99 ms | avg batch | gRPC req/s "
             "| gRPC x (c) | gRPC p50 ms | gRPC p99 ms | (b) req/s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for key, result in results.items():
        name = f"{key} ({result.model.batch1_ms:.3g} ms/inference)"
        for c in ARGS.concurrency:
            a, b, g = result.rows[("a", c)], result.rows[("b", c)], result.rows.get(("a-grpc", c))
            grpc = (f"{g.rps:,.0f} | {g.rps / result.denominator:.2f}x | {g.p50_ms:.2f} | {g.p99_ms:.3g}" if g
                    else " | | | ")
            batch = f"{a.avg_batch:.2f}" if a.avg_batch is not None else ""
            lines.append(f"| {name} | {c} | {a.rps:,.0f} | {a.rps / result.denominator:.2f}x | {ratio(a.rps, b.rps)} | "
                         f"{a.p50_ms:.2f} | {a.p99_ms:.3g} | {batch} | {grpc} | {b.rps:,.0f} |")
            name = key
    lone = [(key, r) for key, r in results.items() if ("p", 1) in r.rows]
    if lone:
        lines += ["", "| model, 1 client | temper binary p50 ms | plain binary p50 ms | temper JSON p50 ms "
                      "| plain JSON p50 ms | temper gRPC p50 ms | (b) p50 ms |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for key, r in lone:
            cells = [r.rows.get((kind, 1)) for kind in ("a", "p", "a-json", "p-json", "a-grpc", "b")]
            lines.append(f"| {key} | " + " | ".join(f"{p.p50_ms:.2f}" if p else "" for p in cells) + " |")
    return "\n".join(lines)


# -- main ------------------------------------------------------------------------------------

ARGS: argparse.Namespace
machine_info: dict[str, Any]


ROLES: dict[str, Callable[[list[str]], int]] = {"--plain-server": plain_server_main, "--grpc-load": grpc_load_main}


def main(argv: list[str] | None = None) -> int:
    global ARGS, machine_info
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ROLES:  # this script started as one of its own helper processes
        return ROLES[argv[0]](argv[1:])
    # SIGTERM, like Ctrl-C, unwinds through the finally blocks that stop the servers (their own sessions:
    # neither signal reaches them from outside).
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-base", type=Path,
                        help="folder for models, bundles, stores and logs (default: a new temp dir, kept)")
    parser.add_argument("--models", default="digits,heavy", help="comma-separated: digits, heavy")
    parser.add_argument("--concurrency", default="1,8,32,64", help="closed-loop client counts")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per load point")
    parser.add_argument("--max-requests", type=int, default=500_000, help="responses per load point at most")
    parser.add_argument("--ceiling-duration", type=float, default=3.0, help="seconds per (c) batch size")
    parser.add_argument("--adjacent-duration", type=float, default=1.5,
                        help="seconds per spin setting for the (c) measured right before each concurrency")
    parser.add_argument("--max-batch", type=int, default=16,
                        help="bundles' max_batch_size, and (c)'s denominator batch")
    parser.add_argument("--max-delay-ms", type=float, default=10.0, help="bundles' max_delay_ms")
    parser.add_argument("--rss-model", default="digits",
                        help="model whose temper server gets the RSS check ('' = none)")
    parser.add_argument("--rss-requests", type=int, default=100_000, help="requests per RSS run (two runs)")
    parser.add_argument("--rss-timeout", type=float, default=300.0, help="seconds an RSS run may take at most")
    parser.add_argument("--no-json-rows", action="store_true", help="skip the rows with a KServe v2 JSON body")
    parser.add_argument("--no-grpc", action="store_true", help="skip the temper-over-gRPC rows")
    parser.add_argument("--plain-concurrency", default="1",
                        help="client counts at which to measure the plain server too, those in --concurrency "
                             "('' = none)")
    parser.add_argument("--load-threshold", type=float, default=1.5,
                        help="1-min load average to wait for before starting")
    parser.add_argument("--max-wait", type=float, default=300.0,
                        help="seconds to wait, each time, for the load to drop / other processes to go quiet")
    parser.add_argument("--noisy", type=float, default=25.0,
                        help="re-measure a concurrency once when other processes used more than this %% CPU during it")
    ARGS = args = parser.parse_args(argv)
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    args.plain_concurrency = [c for c in map(int, filter(str.strip, args.plain_concurrency.split(",")))
                              if c in args.concurrency]
    if args.max_batch not in CEILING_BATCHES:
        parser.error(f"--max-batch must be one of {CEILING_BATCHES} (the batch sizes (c) measures)")
    if shutil.which("wrk") is None:
        print("error: wrk not found; install it (Debian: apt-get install -y wrk)", file=sys.stderr)
        return 3
    if not args.no_grpc:
        try:
            import grpc  # noqa: F401
            from tritonclient.grpc import service_pb2  # noqa: F401
        except (ImportError, RuntimeError) as exc:  # tritonclient reports a missing grpcio as a RuntimeError
            print(f"error: the gRPC rows need the grpc extra (pip install 'temper-ml[grpc]'), or pass --no-grpc: {exc}",
                  file=sys.stderr)
            return 3
    began = time.monotonic()
    base = (args.out_base or Path(tempfile.mkdtemp(prefix="temper-serving-bench-"))).resolve()
    base.mkdir(parents=True, exist_ok=True)
    log(f"outputs: {base}")
    machine_info = machine()
    from temper.artifacts.host import profile

    host = profile().summary()
    log(f"host: {host}")

    builders = {"digits": build_digits, "heavy": build_heavy}
    models = [builders[key.strip()](base) for key in args.models.split(",") if key.strip()]
    asked, load, waited = wait_for_quiet(args.load_threshold, args.max_wait)
    busy = top_processes()
    results = {}
    for model in models:
        results[model.key] = bench_model(model, args, base, model.key == args.rss_model)

    i = machine_info
    grpc = ("" if args.no_grpc else " gRPC: a Python grpc.aio client in its own process, one channel, CONCURRENCY "
            "ModelInfer calls in flight, each resending a pre-built raw-tensor request on its answer.")
    print(f"## Serving benchmark\n\n**Host:** {host}\n\n**Machine:** {i['cpu']}, {i['cores']} cores, "
          f"onnxruntime {i['ort']}, mlflow {i['mlflow']}, Python {i['python']}, {i['date']}. Load generators: HTTP: "
          f"wrk, 1 thread, closed loop on 127.0.0.1.{grpc} {args.duration:g} s per point (at most "
          f"{args.max_requests:,} requests). 1-min load average {asked:.2f} when started, {load:.2f} when measuring "
          f"began (waited {waited:.0f} s; busiest processes then: {busy}); the clients share the {i['cores']} cores "
          "with the server.\n")
    for result in results.values():
        print(table(result) + "\n")
    print(targets(results) + "\n")
    print(summary(results))
    log(f"done in {(time.monotonic() - began) / 60:.1f} min; outputs in {base}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # the servers were stopped on the way out
        print("interrupted", file=sys.stderr)
        sys.exit(130)
