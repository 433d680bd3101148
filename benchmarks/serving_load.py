"""The load benchmarks/serving.py puts on the servers: request bodies, wrk for HTTP, a grpc.aio client for
gRPC, and `measured`, which turns one run of either into a `Point` (req/s, latency, errors, the
average batch temper formed and the CPU other processes used meanwhile).

The gRPC client runs in a process of its own (`serving.py --grpc-load`, `grpc_load_main`) so that
its Python threads neither share the benchmark's GIL nor hide in its CPU time.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.serving_host import SCRIPT, CpuMeter, child_env, log
from benchmarks.serving_models import Model
from benchmarks.serving_servers import Server, request

CLIENT_TIMEOUT_S = 10  # per request, both load generators (wrk --timeout)


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
    """One closed-loop gRPC point, run by serving.py's --grpc-load role in a process of its own: the
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
