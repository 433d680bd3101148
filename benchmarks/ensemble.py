"""An ensemble served by `temper serve` against a client that calls its two stages one after the other (issue 37.6).

    .venv/bin/python -m benchmarks.ensemble [--duration S] [--rounds N] [--conns 1,8,32] [--instances N]

One `temper serve REPO` serves a repository of two stages, a normalisation model and a digits-like CNN (the
models of tests/artifacts/ensembles.py, built here with onnx.helper), and the ensemble `temper export-ensemble`
writes for them. Two closed-loop Python clients (asyncio, keep-alive HTTP/1.1, Triton's binary tensor bodies) drive
the same server, alternating round by round so drift on a shared host hits both alike:
  ensemble  one request per answer: POST /v2/models/digits/infer with the pixels, the logits back
  chained   two requests per answer: POST /v2/models/normalize/infer, then the binary `image` it answers, forwarded
            as it came (no decode), to POST /v2/models/cnn/infer: the cheapest chaining a client can do
Per point the answers/s (one answer = logits for one request of 1 row) and p50/p99 per round, their medians, and
the ratio ensemble / chained. `--instances N` serves each stage in N worker processes (default: temper serve's
own choice, in-process for these tiny models). Markdown to stdout, the host first; progress to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from benchmarks.pyload import Run, Sample
from benchmarks.serving_host import BIN, child_env, log, machine
from benchmarks.serving_servers import free_port, start
from temper.artifacts.formats import bundle
from temper.artifacts.triton.config import export_repository
from temper.artifacts.triton.ensemble import export_ensemble

ROOT = Path(__file__).resolve().parent.parent


def _save(path: Path, nodes: list, inputs: list, outputs: list, weights: list) -> Path:
    graph = helper.make_graph(nodes, path.stem, inputs, outputs, weights)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def stages(folder: Path) -> Path:
    """The repository: normalize ((pixels - 4.5) / 2.5) and cnn (Conv 3x3, Relu, Flatten, MatMul), then `digits`."""
    rng = np.random.default_rng(0)
    image = helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 1, 8, 8])
    normalize = _save(folder / "normalize.onnx", [helper.make_node("Sub", ["pixels", "mean"], ["c"]),
                                                  helper.make_node("Div", ["c", "std"], ["image"])],
                      [helper.make_tensor_value_info("pixels", TensorProto.FLOAT, ["batch", 1, 8, 8])], [image],
                      [numpy_helper.from_array(np.array(4.5, np.float32), "mean"),
                       numpy_helper.from_array(np.array(2.5, np.float32), "std")])
    cnn = _save(folder / "cnn.onnx", [helper.make_node("Conv", ["image", "W"], ["v"]),
                                      helper.make_node("Relu", ["v"], ["r"]), helper.make_node("Flatten", ["r"], ["f"]),
                                      helper.make_node("MatMul", ["f", "FC"], ["logits"])],
                [image], [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
                [numpy_helper.from_array((rng.standard_normal((4, 1, 3, 3)) / 3).astype(np.float32), "W"),
                 numpy_helper.from_array((rng.standard_normal((144, 10)) / 12).astype(np.float32), "FC")])
    repo = folder / "repo"
    for name, model in (("normalize", normalize), ("cnn", cnn)):
        export_repository(bundle.write(folder / name, model, bundle.config_for(model, name)), repo)
    export_ensemble(repo, "digits", ["normalize", "cnn"])
    return repo


def _request(port: int, model: str, name: str, data: bytes) -> bytes:
    head = json.dumps({"inputs": [{"name": name, "shape": [1, 1, 8, 8], "datatype": "FP32",
                                   "parameters": {"binary_data_size": len(data)}}],
                       "parameters": {"binary_data_output": True}}, separators=(",", ":")).encode()
    return (f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: "
            f"{len(head) + len(data)}\r\nContent-Type: application/octet-stream\r\n"
            f"Inference-Header-Content-Length: {len(head)}\r\n\r\n").encode() + head + data


async def _answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """(status, the binary data of the answer's one output)."""
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    fields = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in head[1:] if line)}
    body = await reader.readexactly(int(fields["content-length"]))
    return int(head[0].split()[1]), body[int(fields.get("inference-header-content-length", len(body))):]


async def _closed(port: int, chained: bool, conns: int, duration: float) -> Run:
    run, pixels = Run(), np.full((1, 1, 8, 8), 3.0, "<f4").tobytes()
    began = time.perf_counter()
    end = began + duration

    async def client() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        while (now := time.perf_counter()) < end:
            if chained:
                writer.write(_request(port, "normalize", "pixels", pixels))
                status, image = await _answer(reader)
                if status == 200:
                    writer.write(_request(port, "cnn", "image", image))
                    status, _ = await _answer(reader)
            else:
                writer.write(_request(port, "digits", "pixels", pixels))
                status, _ = await _answer(reader)
            run.samples.append(Sample(now - began, (time.perf_counter() - now) * 1000, status))
        writer.close()

    await asyncio.gather(*(client() for _ in range(conns)))
    run.seconds = time.perf_counter() - began
    return run


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--conns", default="1,8,32")
    parser.add_argument("--instances", type=int, default=None)
    args = parser.parse_args(argv)
    conns = [int(c) for c in args.conns.split(",")]
    points: dict[tuple[str, int], list[Run]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        repo = stages(Path(tmp))
        port = free_port()
        extra = [] if args.instances is None else ["--instances", str(args.instances)]
        server = start("temper serve (ensemble)", [str(BIN / "temper"), "serve", str(repo), "--port", str(port),
                                                   *extra], child_env(), Path(tmp) / "serve.log",
                       "/v2/health/ready", port)
        try:
            for c in conns:
                for r in range(args.rounds):
                    for label in ("ensemble", "chained"):
                        point = asyncio.run(_closed(port, label == "chained", c, args.duration))
                        assert len(point.ok) == len(point.samples), f"{label}: failed requests"
                        log(f"  {label} c={c} round {r}: {point.rps:.0f} answers/s p99 {point.p(99):.2f} ms")
                        points.setdefault((label, c), []).append(point)
        finally:
            server.stop()
    host = machine()
    print(f"Host: {host['cpu']}, {host['cores']} usable cores, onnxruntime {host['ort']}, {host['date']}; "
          f"instances {args.instances if args.instances is not None else 'default'}, {args.rounds} rounds of "
          f"{args.duration:g} s, interleaved\n")
    print("| connections | ensemble answers/s | chained answers/s | ensemble / chained | p50 ms ens / chained | "
          "p99 ms ens / chained |")
    print("|---|---|---|---|---|---|")
    for c in conns:
        rps = [statistics.median(p.rps for p in points[label, c]) for label in ("ensemble", "chained")]
        p50 = [statistics.median(p.p(50) for p in points[label, c]) for label in ("ensemble", "chained")]
        p99 = [statistics.median(p.p(99) for p in points[label, c]) for label in ("ensemble", "chained")]
        print(f"| {c} | {rps[0]:,.0f} | {rps[1]:,.0f} | {rps[0] / rps[1]:.2f}x | {p50[0]:.2f} / {p50[1]:.2f} | "
              f"{p99[0]:.2f} / {p99[1]:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
