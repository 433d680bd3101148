"""What a large input costs `temper serve` through client shared memory vs in the HTTP body (binary).

    .venv/bin/python -m benchmarks.client_shm [--mib 1] [--requests 400] [--rounds 2]

A model that sums an FP32 input of --mib MiB ([1, N] -> [1, 1]) is served by `temper serve
--allow-client-shm` on 127.0.0.1. One tritonclient.http client sends it --requests times, sequentially,
with the input as Triton binary tensor data, then from a registered /dev/shm region
(tritonclient.utils.shared_memory), in alternating rounds. Printed per round: the client's median
latency and the gateway's cost, the server process's CPU time (user + system, from /proc) per request;
the model's own compute is in both. Every answer is checked against numpy's sum.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import tritonclient.http as http
import tritonclient.utils.shared_memory as shm
from onnx import TensorProto, helper, numpy_helper

from temper.artifacts.core.host import profile
from temper.artifacts.formats import bundle

MODEL = "sum"


def _model(path: Path, elements: int) -> Path:
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    graph = helper.make_graph([helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=1)], MODEL,
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", elements])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 1])], [axes])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, default=1.0)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    elements = int(args.mib * 1024 * 1024 // 4)
    root = Path(tempfile.mkdtemp(prefix="temper-shm-bench-"))
    model = _model(root / "sum.onnx", elements)
    folder = bundle.write(root / "bundle", model, bundle.config_for(model, MODEL, max_batch_size=4))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    code = "import sys; from temper.pipeline.cli import main; sys.argv[0] = 'temper'; main()"
    server = subprocess.Popen([sys.executable, "-c", code, "serve", str(folder), "--port", str(port),
                               "--allow-client-shm", "--max-body-mb", str(args.mib * 2 + 1)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    client = http.InferenceServerClient(f"127.0.0.1:{port}")
    key = f"/temper_bench_{os.getpid()}"
    data = np.random.default_rng(0).standard_normal((1, elements)).astype(np.float32)
    handle = shm.create_shared_memory_region("in", key, data.nbytes)
    try:
        for _ in range(600):
            try:
                if client.is_server_ready():
                    break
            except Exception:  # noqa: BLE001 - not listening yet
                pass
            time.sleep(0.1)
        shm.set_shared_memory_region(handle, [data])
        client.register_system_shared_memory("in", key, data.nbytes)
        print(f"{args.mib:g} MiB FP32 input, {args.requests} sequential requests per round; {profile().summary()}")
        for round_ in range(args.rounds):
            for kind in ("binary", "shared memory"):
                x = http.InferInput("x", [1, elements], "FP32")
                if kind == "binary":
                    x.set_data_from_numpy(data, binary_data=True)
                else:
                    x.set_shared_memory("in", data.nbytes)
                outputs = [http.InferRequestedOutput("y", binary_data=True)]
                for _ in range(30):  # warm: connection, arena
                    client.infer(MODEL, [x], outputs=outputs)
                latencies, before = [], _cpu_s(server.pid)
                for _ in range(args.requests):
                    start = time.perf_counter()
                    result = client.infer(MODEL, [x], outputs=outputs)
                    latencies.append(time.perf_counter() - start)
                cpu_us = (_cpu_s(server.pid) - before) / args.requests * 1e6
                np.testing.assert_allclose(result.as_numpy("y")[0, 0], data.sum(dtype=np.float64), rtol=1e-3)
                print(f"round {round_ + 1} {kind:>13}: median latency {statistics.median(latencies) * 1e6:,.0f} us, "
                      f"server CPU {cpu_us:,.0f} us per request")
        client.unregister_system_shared_memory()
    finally:
        shm.destroy_shared_memory_region(handle)
        server.send_signal(signal.SIGINT)
        server.communicate(timeout=30)


if __name__ == "__main__":
    main()
