"""`temper serve` under hostile load: idle and half-sent connections, the connection limit, the
open-file limit, and large JSON bodies beside small requests. Real servers on loopback, real
sockets and clients; every count and wait is bounded, and every socket and process is closed."""

from __future__ import annotations

import http.client
import json
import selectors
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from temper.artifacts.serving.runtime import Runtime
from tests.artifacts.servers import (
    Client,
    Served,
    _bundle,
    _counter,
    _expected,
    _inputs,
    _json_request,
    _metrics,
    _temper_serve,
)

HALF_HEADERS = b"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le"


@pytest.fixture
def sockets() -> Iterator[list[socket.socket]]:
    """Raw client sockets a test opens; all closed after it."""
    opened: list[socket.socket] = []
    yield opened
    for s in opened:
        s.close()


def _connect(port: int, sockets: list[socket.socket], send: bytes = b"") -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    sockets.append(s)
    if send:
        s.sendall(send)
    return s


def _closed_within(watched: list[socket.socket], seconds: float) -> set[socket.socket]:
    """The sockets the server closed (read to EOF, whatever it wrote first) within `seconds`."""
    closed: set[socket.socket] = set()
    with selectors.DefaultSelector() as selector:
        for s in watched:
            selector.register(s, selectors.EVENT_READ)
        deadline = time.monotonic() + seconds
        while len(closed) < len(watched) and (left := deadline - time.monotonic()) > 0:
            for key, _ in selector.select(left):
                try:
                    data = key.fileobj.recv(65536)
                except ConnectionResetError:
                    data = b""
                if not data:
                    closed.add(key.fileobj)
                    selector.unregister(key.fileobj)
    return closed


def _check_answer(port: int, reference: ort.InferenceSession, seed: int) -> float:
    """One request on a new connection: its answer checked, its latency in seconds."""
    c = Client(port)
    inputs = _inputs(seed)
    began = time.monotonic()
    status, _, body = c.infer(_json_request(inputs))
    elapsed = time.monotonic() - began
    c.close()
    assert status == 200, body
    want = _expected(reference, inputs)["y"].ravel()
    np.testing.assert_allclose(json.loads(body)["outputs"][0]["data"], want, rtol=1e-6)
    return elapsed


def _scrape(port: int) -> dict:
    watcher = Client(port)
    metrics = _metrics(watcher)
    watcher.close()
    return metrics


def test_idle_and_half_sent_connections_time_out_and_never_block_a_client(tiny: Path, reference, sockets) -> None:
    with Served(Runtime(tiny), header_timeout_s=1.5, keep_alive_s=1.5) as served:
        opened = time.monotonic()
        idle = [_connect(served.port, sockets) for _ in range(300)]
        half = [_connect(served.port, sockets, HALF_HEADERS) for _ in range(100)]
        assert _check_answer(served.port, reference, 30) < 1.0  # served promptly beside 400 silent connections
        assert not _closed_within(idle[:5] + half[:5], 0.2) and time.monotonic() - opened < 1.4  # still open

        keep_alive = Client(served.port)  # a finished request's connection, then idle
        assert keep_alive.infer(_json_request(_inputs(31)))[0] == 200
        closed = _closed_within(idle + half + [keep_alive.conn.sock], 10)
        waited = time.monotonic() - opened
        assert len(closed) == 401 and waited >= 1.5
        keep_alive.close()
        assert _check_answer(served.port, reference, 32) < 1.0
        metrics = _scrape(served.port)
    assert _counter(metrics, "temper_http_connections_closed_total", reason="header_timeout") == 400


def _request_bytes(inputs: dict[str, np.ndarray]) -> bytes:
    body = json.dumps(_json_request(inputs)).encode()
    return (b"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body))


def _read_response(s: socket.socket) -> bytes:
    """One whole HTTP response from a raw socket (the server always sends Content-Length)."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += s.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    headers = dict(line.lower().split(b": ", 1) for line in head.split(b"\r\n")[1:])
    length = int(headers[b"content-length"])
    while len(body) < length:
        body += s.recv(65536)
    return head + b"\r\n\r\n" + body


def test_a_stalled_body_or_next_request_is_dropped(tiny: Path, sockets) -> None:
    """Deadlines run from the first byte that leaves a request part-way: its body, or a keep-alive
    connection's next request headers (uvicorn's own keep-alive timer is set far off here)."""
    with Served(Runtime(tiny), header_timeout_s=1.0, body_timeout_s=1.0, keep_alive_s=30) as served:
        stalled_body = _connect(served.port, sockets, b"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                                      b"Content-Length: 100\r\n\r\n{")
        keep_alive = _connect(served.port, sockets, _request_bytes(_inputs(36)))
        assert _read_response(keep_alive).startswith(b"HTTP/1.1 200 ")
        time.sleep(1.5)  # idle between requests: no header deadline yet
        keep_alive.sendall(HALF_HEADERS)
        began = time.monotonic()
        assert _closed_within([stalled_body, keep_alive], 5) == {stalled_body, keep_alive}
        assert time.monotonic() - began > 0.8
        metrics = _scrape(served.port)
    assert _counter(metrics, "temper_http_connections_closed_total", reason="body_timeout") == 1
    assert _counter(metrics, "temper_http_connections_closed_total", reason="header_timeout") == 1


def test_at_the_connection_limit_the_longest_idle_goes_then_new_ones_are_refused(tiny: Path, reference,
                                                                                   sockets) -> None:
    busy_request = b"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{"

    def settle() -> None:  # the server registers a connection a moment after connect() returns
        time.sleep(0.2)

    with Served(Runtime(tiny), max_connections=4, header_timeout_s=30) as served:
        first = _connect(served.port, sockets)
        settle()
        second = _connect(served.port, sockets)
        settle()
        busy = [_connect(served.port, sockets, busy_request) for _ in range(2)]  # headers in, body pending
        settle()
        client = Client(served.port)  # the 5th connection: the longest idle one (first) makes room
        assert client.infer(_json_request(_inputs(33)))[0] == 200
        assert _closed_within([first], 5) == {first} and not _closed_within([second], 0.1)
        newest = _connect(served.port, sockets)  # now second has waited longest: it goes
        assert _closed_within([second], 5) == {second}
        client.close()
        newest.sendall(busy_request)
        busy.append(newest)
        settle()
        busy.append(_connect(served.port, sockets, busy_request))
        settle()  # 4 connections, each in the middle of a request: nothing to evict
        refused = _connect(served.port, sockets)
        refused.settimeout(5)
        answer = refused.recv(65536)
        assert answer.startswith(b"HTTP/1.1 503 ") and b"too many connections" in answer
        assert _closed_within([refused], 5) == {refused}
        for s in busy:
            s.close()
        settle()
        assert _check_answer(served.port, reference, 34) < 1.0
        metrics = _scrape(served.port)
    assert _counter(metrics, "temper_http_connections_closed_total", reason="evicted") == 2
    assert _counter(metrics, "temper_http_connections_closed_total", reason="refused") == 1


def test_idle_connections_beyond_the_open_file_limit_do_not_stop_service(tiny: Path, reference, sockets) -> None:
    """`temper serve` with 512 file descriptors and 600 idle connections: the oldest make room."""
    limit = ("import resource; "
             "resource.setrlimit(resource.RLIMIT_NOFILE, (512, resource.getrlimit(resource.RLIMIT_NOFILE)[1])); ")
    with _temper_serve(str(tiny), prelude=limit) as (port, output):
        idle = [_connect(port, sockets) for _ in range(600)]
        assert _check_answer(port, reference, 35) < 2.0
        evicted = _closed_within(idle, 1.0)
        assert 100 <= len(evicted) < 600  # room was made under the limit, not by the 5 s header timeout
        assert idle[0] in evicted and idle[-1] not in evicted  # the longest idle first
    assert "Too many open files" not in output["stderr"]


def _wide_model(path: Path) -> Path:
    """total = row sums of x (FP32 [-1, -1] -> [-1, 1]): any row length, for bodies of any size."""
    axes = numpy_helper.from_array(np.array([1], dtype=np.int64), "axes")
    graph = helper.make_graph([helper.make_node("ReduceSum", ["x", "axes"], ["total"], keepdims=1)], "wide",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "length"])],
                              [helper.make_tensor_value_info("total", TensorProto.FLOAT, ["batch", 1])], [axes])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_large_json_bodies_do_not_stall_small_requests(tmp_path: Path) -> None:
    """Four 16 MiB JSON bodies at once; meanwhile small requests keep being answered, correctly."""
    folder = _bundle(tmp_path / "wide", _wide_model(tmp_path / "wide.onnx"), "wide", max_batch_size=8)
    big = np.round(np.random.default_rng(0).random((8, 200_000)), 6).astype(np.float32)
    body = json.dumps({"inputs": [{"name": "x", "shape": list(big.shape), "datatype": "FP32",
                                   "data": big.ravel().tolist()}]}).encode()
    assert len(body) > 16 * 1024 * 1024
    with Served(Runtime(folder), max_body_bytes=64 * 1024 * 1024) as served:
        done = threading.Event()

        def send_big(_: int) -> tuple[int, np.ndarray]:
            conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=120)
            conn.request("POST", "/v2/models/wide/infer", body=body, headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            reply = json.loads(response.read())
            conn.close()
            return response.status, np.asarray(reply["outputs"][0]["data"]) if response.status == 200 else reply

        def small_requests() -> list[float]:
            c, latencies, seed = Client(served.port), [], 0
            while not done.is_set() and len(latencies) < 2000:
                x = np.random.default_rng(seed).random((1, 4)).astype(np.float32)
                request = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": x.ravel().tolist()}]}
                began = time.monotonic()
                status, _, reply = c.infer(request, model="wide")
                latencies.append(time.monotonic() - began)
                assert status == 200, reply
                assert json.loads(reply)["outputs"][0]["data"] == pytest.approx([float(x.sum())], rel=1e-5)
                seed += 1
                time.sleep(0.02)
            c.close()
            return latencies

        with ThreadPoolExecutor(5) as pool:
            small = pool.submit(small_requests)
            time.sleep(0.2)  # small requests flowing before the big ones start
            bigs = list(pool.map(send_big, range(4)))
            done.set()
            latencies = small.result()
    for status, totals in bigs:
        assert status == 200, totals
        np.testing.assert_allclose(totals, big.sum(axis=1), rtol=1e-4)
    assert len(latencies) >= 5 and max(latencies) < 2.0, sorted(latencies)[-5:]
