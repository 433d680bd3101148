"""HTTP request headers over the limits, over raw sockets against a real server: a value of 37 MiB,
more fields than MAX_HEADERS, a header section that never ends; each is answered 431 while a normal
client on its own connection goes on being answered correctly."""

from __future__ import annotations

import json
import socket
import threading

import onnxruntime as ort
import pytest

from temper.artifacts.serving.http_limits import MAX_HEADER_BYTES, MAX_HEADERS
from tests.artifacts.servers import MODEL, Client, Served, _counter, _expected, _inputs, _json_request, _metrics


def _request(extra: bytes) -> bytes:
    body = json.dumps(_json_request(_inputs(3))).encode()
    return (b"POST /v2/models/%s/infer HTTP/1.1\r\nHost: test\r\n%sContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (MODEL.encode(), extra, len(body), body))


def _send(port: int, data: bytes) -> bytes:
    """Send `data` (all of it, if the server reads it) and read the answer until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        try:
            sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # closed before the end was sent: what it answered is still there to read
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        return answer


def _normal_client_answered(port: int, reference: ort.InferenceSession) -> None:
    c = Client(port)
    inputs = _inputs(4)
    status, _, body = c.infer(_json_request(inputs))
    c.close()
    assert status == 200, body
    y = json.loads(body)["outputs"][0]
    assert y["name"] == "y" and y["data"] == pytest.approx(_expected(reference, inputs)["y"].ravel().tolist(), abs=1e-6)


def _fields(count: int, value: bytes = b"v") -> bytes:
    return b"".join(b"X-Field-%d: %s\r\n" % (i, value) for i in range(count))


OVER = {
    "a 37 MiB header value": (b"X-Big: " + b"a" * (37 << 20) + b"\r\n", f"over the limit of {MAX_HEADER_BYTES:,}"),
    "200,000 small fields": (_fields(200_000), f"more than {MAX_HEADERS} header fields"),
    "one field more than MAX_HEADERS": (_fields(MAX_HEADERS - 2), f"more than {MAX_HEADERS} header fields"),  # + 3 own
    "fields summing past the limit": (_fields(90, b"v" * 800), f"over the limit of {MAX_HEADER_BYTES:,}"),
    "a long URL": (b"", f"over the limit of {MAX_HEADER_BYTES:,}"),
}


@pytest.mark.parametrize("extra, message", OVER.values(), ids=OVER.keys())
def test_headers_over_the_limits_are_431_and_others_are_served(server: Served, reference: ort.InferenceSession,
                                                                extra: bytes, message: str) -> None:
    request = _request(extra)
    if not extra:  # the URL: a query string as long as the limit
        request = request.replace(b"/infer HTTP/1.1", b"/infer?q=" + b"a" * MAX_HEADER_BYTES + b" HTTP/1.1")
    before = _counter(_metrics(Client(server.port)), "temper_http_connections_closed_total", reason="headers_too_large")
    answer = _send(server.port, request)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 431 "), answer[:300]
    assert message in json.loads(body)["error"] and b"connection: close" in head
    _normal_client_answered(server.port, reference)
    after = _counter(_metrics(Client(server.port)), "temper_http_connections_closed_total", reason="headers_too_large")
    assert after == before + 1


def test_headers_just_within_the_limits_are_answered(server: Served, reference: ort.InferenceSession) -> None:
    """MAX_HEADERS fields (the request's own three among them) near MAX_HEADER_BYTES in all: 200."""
    value = b"v" * ((MAX_HEADER_BYTES - 2048) // (MAX_HEADERS - 3))
    answer = _send(server.port, _request(_fields(MAX_HEADERS - 3, value)).replace(b"Host: test", b"Connection: close"))
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:300]
    _normal_client_answered(server.port, reference)


def test_a_header_section_that_never_ends_is_refused_while_it_streams(server: Served,
                                                                      reference: ort.InferenceSession) -> None:
    """Headers that keep coming, never finished: refused once past the limit (not at the header
    timeout), so they cannot grow the server's memory; the client is answered meanwhile."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=60) as sock:
        sock.sendall(b"POST /v2/models/%s/infer HTTP/1.1\r\nHost: test\r\nX-Slow: " % MODEL.encode())
        stop = threading.Event()

        def trickle() -> None:
            try:
                while not stop.is_set():
                    sock.sendall(b"a" * 4096)
            except OSError:
                pass  # the server closed it

        sender = threading.Thread(target=trickle)
        sender.start()
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        stop.set()
        sender.join()
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:300]
    _normal_client_answered(server.port, reference)
