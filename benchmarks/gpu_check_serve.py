"""`temper serve` of a run's selected model for benchmarks/gpu_check.py: closed-loop load over HTTP (Triton's
binary extension) and gRPC, one /metrics scrape, and memory over requests of varying shapes.

The HTTP load generator is a Python asyncio client in a process of its own (`--http-load`) rather than
serving.py's wrk, because the lent GPU machine has no wrk and no package registry: the CPU dry run and
the GPU run then measure the same way. gRPC reuses serving_load.grpc_load (tritonclient's stubs).
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from benchmarks.recipes import _temper
from benchmarks.serving_host import ROOT, child_env
from benchmarks.serving_load import CLIENT_TIMEOUT_S, grpc_load, metrics, temper_binary_body
from benchmarks.serving_models import Model, _input_name, rounded_sample
from benchmarks.serving_servers import Server, free_port, request, start

MiB = 1024 * 1024
MAX_BATCH = 64  # the bundle's max_batch_size: the most clients measured, so no request waits for a second batch
FLAT_RULE = ("flat: the last sample is at most 10% + 8 MiB above the first checkpoint's (after a tenth of the "
             "requests: the start-up sample precedes every shape, so arenas filling count as warm-up), and no "
             "sample of the second half exceeds the first half's highest by more than 5% + 8 MiB")


def bundle(output: Path, dest: Path) -> tuple[Path, dict[str, Any]]:
    """What `temper serve OUTPUT` would serve (pipeline.outputs.servable: the selected model, its engine and gated
    session settings), written as a bundle with max_batch_size MAX_BATCH instead of the default 16."""
    from temper.artifacts.formats import bundle as bundles
    from temper.pipeline.outputs import servable

    folder, config = servable(output)
    assert config is not None  # a run's output folder, never a published bundle
    config = type(config).model_validate({**config.model_dump(), "max_batch_size": MAX_BATCH})
    bundles.write(dest, folder / "model.onnx", config)
    return dest, {"model_folder": str(folder), "name": config.name, "engine": config.engine,
                  "max_batch_size": config.max_batch_size, "max_delay_ms": config.max_delay_ms,
                  "session": config.session.model_dump() if config.session else None}


def serve(folder: Path, base: Path) -> Server:
    """`temper serve BUNDLE --port P --grpc-port G` (the console script), in a session of its own."""
    temper = _temper()
    if temper is None:
        raise SystemExit("error: no `temper` console script beside this Python or on PATH")
    port, grpc_port = free_port(), free_port()
    server = start("temper serve", [temper, "serve", str(folder), "--port", str(port), "--grpc-port", str(grpc_port)],
                   child_env(), base / f"serve-{folder.name}.log", "/v2/health/ready", port)
    server.grpc_port = grpc_port
    return server


def model_of(folder: Path, name: str, row_shape: tuple[int, ...]) -> Model:
    sample, values = rounded_sample((1, *row_shape), 1.0)
    return Model(name, folder / "model.onnx", _input_name(folder / "model.onnx"), sample, values)


def answer(server: Server, model: Model, rows: np.ndarray) -> np.ndarray:
    """The server's own output for `rows` (HTTP binary): what every later answer is checked against."""
    body = temper_binary_body(Model(model.key, model.path, model.input_name, rows, []))
    status, headers, raw = request(server.port, "POST", body.path, body.payload, body.headers)
    if status != 200:
        raise SystemExit(f"error: temper serve answered {status}: {raw[:300]!r}")
    n = int(headers["inference-header-content-length"])
    head = json.loads(raw[:n])
    return np.frombuffer(raw[n:], dtype="<f4").reshape(head["outputs"][0]["shape"])


def load_points(server: Server, model: Model, clients: list[int], seconds: float, base: Path) -> list[dict[str, Any]]:
    """Each protocol at each client count: req/s (one row each), latency, errors, the average batch formed."""
    expected = answer(server, model, model.sample)
    points = []
    for protocol in ("http-binary", "grpc"):
        for n in clients:
            before = metrics(server.port)
            got: dict[str, Any]
            if protocol == "grpc":
                assert server.grpc_port is not None
                p = grpc_load(server.grpc_port, model, expected, n, seconds, 10_000_000, base)
                got = {"requests": p.requests, "seconds": p.seconds, "p50_ms": p.p50_ms, "p99_ms": p.p99_ms,
                       "errors": p.error_kinds}
            else:
                got = http_load(server.port, model, expected, n, seconds, base)
            after = metrics(server.port)
            executions = after["nv_inference_exec_count"] - before["nv_inference_exec_count"]
            rows = after["nv_inference_count"] - before["nv_inference_count"]
            points.append({"protocol": protocol, "clients": n, **got, "req_per_s": got["requests"] / got["seconds"],
                           "avg_batch": rows / executions if executions else None})
            print(f"  {protocol} c={n}: {points[-1]['req_per_s']:,.0f} req/s, p50 {got['p50_ms']:.2f} ms, "
                  f"errors {sum(got['errors'].values())}", file=sys.stderr, flush=True)
    return points


def memory_lines(port: int) -> list[str]:
    """The /metrics samples whose metric name speaks of memory, as exposed."""
    _, _, raw = request(port, "GET", "/metrics")
    return [line for line in raw.decode().splitlines()
            if line and not line.startswith("#") and "mem" in line.split("{")[0].split(" ")[0].lower()]


# -- HTTP load generator (its own process) ---------------------------------------------------------------


def http_load(port: int, model: Model, expected: np.ndarray, clients: int, seconds: float,
              base: Path) -> dict[str, Any]:
    body = temper_binary_body(model)
    (base / "http-body.bin").write_bytes(body.payload)
    np.save(base / "http-expected.npy", expected)
    spec = {"port": port, "path": body.path, "headers": body.headers, "body": str(base / "http-body.bin"),
            "expected": str(base / "http-expected.npy"), "clients": clients, "seconds": seconds}
    (base / "http-load.json").write_text(json.dumps(spec))
    proc = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check_serve", "--http-load",
                           str(base / "http-load.json")], capture_output=True, text=True, env=child_env(), cwd=ROOT,
                          timeout=seconds + CLIENT_TIMEOUT_S + 120, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise SystemExit(f"error: the HTTP load generator exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    result = json.loads(lines[-1][len("RESULT "):])
    if "mismatch" in result:
        raise SystemExit(f"error: temper serve (HTTP) returned {result['mismatch']}, expected {expected.ravel()[:5]}")
    return result


async def _http_drive(spec: dict[str, Any]) -> dict[str, Any]:
    """`clients` keep-alive connections, each resending the same request as soon as its answer is in."""
    payload = Path(spec["body"]).read_bytes()
    head = "".join(f"{k}: {v}\r\n" for k, v in spec["headers"].items())
    message = (f"POST {spec['path']} HTTP/1.1\r\nHost: 127.0.0.1\r\n{head}Content-Length: {len(payload)}\r\n\r\n"
               ).encode() + payload
    expected = np.load(spec["expected"])
    latencies: list[int] = []
    errors: dict[str, int] = {}
    mismatch: list[float] = []
    deadline = 0.0

    async def lone() -> None:
        """One request alone (batch 1, as the reference answer was), checked against it."""
        reader, writer = await asyncio.open_connection("127.0.0.1", spec["port"])
        try:
            writer.write(message)
            status, headers, body = await asyncio.wait_for(_response(reader), CLIENT_TIMEOUT_S)
        finally:
            writer.close()
        n = int(headers.get("inference-header-content-length", 0))
        got = np.frombuffer(body[n:], dtype="<f4") if status == 200 and n else np.zeros(0, np.float32)
        if got.size != expected.size or not np.allclose(got, expected.ravel(), rtol=1e-3, atol=1e-4):
            mismatch.extend([float(status), *got.ravel()[:5].tolist()])

    async def client() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", spec["port"])
        try:
            while time.monotonic() < deadline:
                began = time.perf_counter_ns()
                writer.write(message)
                status, _, _ = await asyncio.wait_for(_response(reader), CLIENT_TIMEOUT_S)
                if status != 200:
                    errors[str(status)] = errors.get(str(status), 0) + 1
                    continue
                latencies.append(time.perf_counter_ns() - began)
        finally:
            writer.close()

    await lone()
    if mismatch:
        return {"mismatch": mismatch}
    deadline = time.monotonic() + spec["seconds"]
    began = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(spec["clients"])))
    seconds = time.perf_counter() - began
    ms = np.asarray(latencies, dtype=np.float64) / 1e6
    p50, p99 = np.percentile(ms, [50, 99]).tolist() if ms.size else [float("nan")] * 2
    return {"requests": len(latencies) + sum(errors.values()), "seconds": seconds, "p50_ms": p50, "p99_ms": p99,
            "errors": errors}


async def _response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    lines = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
    return int(lines[0].split()[1]), headers, await reader.readexactly(int(headers.get("content-length", 0)))


def http_load_main(spec_file: str) -> int:
    with contextlib.suppress(ImportError):
        import uvloop

        uvloop.install()
    print("RESULT " + json.dumps(asyncio.run(_http_drive(json.loads(Path(spec_file).read_text())))), flush=True)
    return 0


# -- memory over varying shapes ------------------------------------------------------------------------


def gpu_memory_mib(pids: set[int]) -> tuple[float | None, str]:
    """GPU memory of `pids` from nvidia-smi's compute apps; the device's whole used memory when none of them is
    listed (a container may not see its own pids there). (None, why) without nvidia-smi."""
    try:
        apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=30, check=True).stdout
        used = [float(m) for p, m in (line.split(",") for line in apps.splitlines() if line.strip())
                if int(p) in pids]
        if used:
            return sum(used), "compute-apps of the server and its workers"
        total = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                               capture_output=True, text=True, timeout=30, check=True).stdout
        return sum(float(v) for v in total.split()), "memory.used of the whole device (no pid of ours listed)"
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        return None, f"nvidia-smi: {type(exc).__name__}: {exc}"


def tree(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def sample_memory(pid: int, done: int, gpu: bool) -> dict[str, Any]:
    processes = tree(pid)
    rss = 0
    for p in processes:
        with contextlib.suppress(psutil.Error):
            rss += p.memory_info().rss
    found: dict[str, Any] = {"requests": done, "rss_mib": rss / MiB, "pids": len(processes)}
    if gpu:
        found["gpu_mib"], found["gpu_source"] = gpu_memory_mib({p.pid for p in processes})
    return found


def soak(server: Server, model: Model, total: int, max_rows: int, clients: int, gpu: bool) -> dict[str, Any]:
    """`total` requests of 1..max_rows random rows from `clients` threads; memory at the start, every tenth of
    `total` requests and at the end. Every answer must be HTTP 200 with one output row per input row."""
    every = max(1, total // 10)
    samples = [sample_memory(server.proc.pid, 0, gpu)]
    lock, state = threading.Lock(), {"sent": 0, "done": 0, "errors": 0, "rows": 0}
    first_errors: list[str] = []

    def client(index: int) -> None:
        rng = np.random.default_rng([7, index])
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
        while True:
            with lock:
                if state["sent"] >= total:
                    break
                state["sent"] += 1
            rows = int(rng.integers(1, max_rows + 1))
            batch = rng.random((rows, *model.sample.shape[1:]), dtype=np.float32)
            body = temper_binary_body(Model(model.key, model.path, model.input_name, batch, []))
            error = None
            try:
                conn.request("POST", body.path, body.payload, body.headers)
                response = conn.getresponse()
                raw = response.read()
                n = int(response.getheader("Inference-Header-Content-Length") or 0)
                shape = json.loads(raw[:n])["outputs"][0]["shape"] if response.status == 200 and n else None
                if shape is None or shape[0] != rows:
                    error = f"HTTP {response.status}, {rows} rows: {raw[:200]!r}"
            except (OSError, http.client.HTTPException, ValueError) as exc:
                error = f"{type(exc).__name__}: {exc}"
                conn.close()
            with lock:
                state["done"] += 1
                state["rows"] += rows
                state["errors"] += error is not None
                if error and len(first_errors) < 5:
                    first_errors.append(error)
                checkpoint = state["done"] % every == 0 and state["done"] < total
                done = state["done"]
            if checkpoint:
                samples.append(sample_memory(server.proc.pid, done, gpu))
        conn.close()

    began = time.monotonic()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.monotonic() - began
    samples.sort(key=lambda s: s["requests"])
    samples.append(sample_memory(server.proc.pid, state["done"], gpu))
    return {"requests": state["done"], "rows": state["rows"], "errors": state["errors"], "first_errors": first_errors,
            "seconds": seconds, "clients": clients, "rows_per_request": [1, max_rows], "samples": samples,
            "flat_rule": FLAT_RULE, **{f"{key}_flat": flat([s[key] for s in samples])
                                       for key in ("rss_mib", "gpu_mib") if all(s.get(key) is not None
                                                                                 for s in samples)}}


def flat(values: list[float]) -> bool:
    """FLAT_RULE on samples taken at the start, each checkpoint and the end (the start one is left out: it
    precedes the first request, so every arena and cache the shapes fill is growth from it)."""
    series = values[1:]
    if len(series) < 3:
        return False  # too few samples to say
    half = len(series) // 2
    end_ok = series[-1] <= series[0] * 1.10 + 8
    tail_ok = max(series[half:]) <= max(series[:half]) * 1.05 + 8
    return end_ok and tail_ok


if __name__ == "__main__":
    if sys.argv[1:2] == ["--http-load"]:
        sys.exit(http_load_main(sys.argv[2]))
    sys.exit("usage: python -m benchmarks.gpu_check_serve --http-load SPEC.json (benchmarks/gpu_check.py runs it)")
