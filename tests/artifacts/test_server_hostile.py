"""`temper serve` over real HTTP against bad and hostile requests: malformed JSON and binary framing,
NaN, compressed bodies and bombs, body limits, unknown paths; the server answers each and serves on."""

from __future__ import annotations

import gzip
import json
import zlib
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from temper.artifacts.formats import bundle
from temper.artifacts.serving.http_limits import JSON_BYTES_PER_ELEMENT, MAX_BODY_BYTES, MIN_BODY_BYTES, body_limit
from temper.artifacts.serving.runtime import Runtime
from temper.artifacts.serving.server import InferenceServer
from tests.artifacts.servers import (
    MAX_BODY,
    MODEL,
    Client,
    Served,
    _binary_outputs,
    _bundle,
    _counter,
    _expected,
    _inputs,
    _json_request,
    _metrics,
)

# -- bad requests --------------------------------------------------------------------------------


def _log_model(path: Path) -> Path:
    """y = log(x) (FP32 [-1, 2]): NaN for a negative x, -Inf for 0, for non-finite outputs."""
    graph = helper.make_graph([helper.make_node("Log", ["x"], ["y"])], "log",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path

def _good(inputs: dict[str, np.ndarray]) -> list[dict]:
    return _json_request(inputs)["inputs"]


def _with(index: int, **change: object) -> dict:
    inputs = _good(_inputs(6))
    inputs[index] = {**inputs[index], **change}
    return {"inputs": inputs}


BAD = {
    "malformed JSON": (b'{"inputs": [', "malformed JSON"),
    "not an object": (b"[1, 2]", "JSON object"),
    "no inputs": ({"outputs": []}, '"inputs"'),
    "unknown input": (_with(0, name="z"), "unknown input 'z'"),
    "missing input": ({"inputs": _good(_inputs(6))[:1]}, "missing input"),
    "input given twice": ({"inputs": _good(_inputs(6))[:1] * 2 + _good(_inputs(6))[1:]}, "twice"),
    "wrong datatype": (_with(0, datatype="FP64"), "datatype 'FP64'"),
    "wrong shape for the model": (_with(0, shape=[1, 8], data=[0.5] * 8), "shape"),
    "negative dim": (_with(0, shape=[-2, 4]), "non-negative"),
    "data not matching its shape": (_with(0, shape=[3, 4]), "elements"),
    "data not numbers": (_with(0, data=["a"] * 8), "not FP32"),
    "ragged nested data": (_with(0, data=[[1.0, 2.0, 3.0, 4.0], [1.0]]), "not FP32"),
    "batch over max_batch_size": ({"inputs": _good(_inputs(6, rows=9))}, "max_batch_size"),
    "unknown output": ({"inputs": _good(_inputs(6)), "outputs": [{"name": "nope"}]}, "unknown output"),
    "NaN literal (not JSON)": (b'{"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", '
                               b'"data": [NaN, 1, 2, 3]}]}', "malformed JSON"),
    "NaN as null": (_with(0, data=[None] * 8), "NaN or infinite"),
    "float32 overflow to Inf": (_with(0, data=[1e39] + [0.5] * 7), "NaN or infinite"),
    "nested 100k deep": (b'{"inputs": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "malformed JSON"),
    "id not a string": ({"id": {"a": 1}, "inputs": _good(_inputs(6))}, '"id" must be a string'),
    "binary_data_output a string": ({"inputs": _good(_inputs(6)), "parameters": {"binary_data_output": "false"}},
                                    "parameters.binary_data_output must be true or false (a JSON boolean), "
                                    "got 'false'"),
    "binary_data a number": ({"inputs": _good(_inputs(6)),
                              "outputs": [{"name": "y", "parameters": {"binary_data": 0}}]},
                             "outputs[0].parameters.binary_data must be true or false"),
}


@pytest.mark.parametrize("body, message", BAD.values(), ids=BAD.keys())
def test_bad_request_is_400_and_the_server_keeps_serving(
        client: Client, reference: ort.InferenceSession, body, message: str) -> None:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    status, headers, reply = client.call("POST", f"/v2/models/{MODEL}/infer", raw, {"Content-Type": "application/json"})
    assert status == 400, reply
    assert headers["content-type"] == "application/json" and message in json.loads(reply)["error"]
    inputs = _inputs(7)  # the same keep-alive connection, then the answer is still right
    status, _, reply = client.infer(_json_request(inputs))
    assert status == 200
    np.testing.assert_allclose(json.loads(reply)["outputs"][0]["data"], _expected(reference, inputs)["y"].ravel(),
                               rtol=1e-6)


BAD_BINARY = {
    "size not matching the shape": (lambda x: {"binary_data_size": x.nbytes - 4}, lambda x: x.tobytes(), None,
                                    "binary_data_size"),
    "body shorter than declared": (lambda x: {"binary_data_size": x.nbytes}, lambda x: x.tobytes()[:-4], None, "ends"),
    "bytes nobody claims": (lambda x: {"binary_data_size": x.nbytes}, lambda x: x.tobytes() + b"xxxx", None,
                            "no input claims"),
    "header length past the body": (lambda x: {"binary_data_size": x.nbytes}, lambda x: x.tobytes(), "999999",
                                    "Inference-Header-Content-Length"),
    "header length not a number": (lambda x: {"binary_data_size": x.nbytes}, lambda x: x.tobytes(), "ten",
                                   "Inference-Header-Content-Length"),
    # past what int() takes (4,300 digits): was a 500 with a traceback; the answer quotes only its start
    "header length of 4,301 digits": (lambda x: {"binary_data_size": x.nbytes}, lambda x: x.tobytes(), "9" * 4301,
                                      "'999999999999999999999999...' (4,301 characters) is not a length"),
    "header length of 40 digits": (lambda x: {"binary_data_size": x.nbytes}, lambda x: x.tobytes(), "1" * 40,
                                   "(40 characters) is not a length"),
}


@pytest.mark.parametrize("params, payload, header, message", BAD_BINARY.values(), ids=BAD_BINARY.keys())
def test_bad_binary_framing_is_400(client: Client, params, payload, header, message: str) -> None:
    inputs = _inputs(8)
    x = inputs["x"]
    head = json.dumps({"inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32", "parameters": params(x)},
                                  _good(inputs)[1]]}).encode()
    headers = {"Inference-Header-Content-Length": header or str(len(head))}
    status, _, reply = client.call("POST", f"/v2/models/{MODEL}/infer", head + payload(x), headers)
    assert status == 400 and message in json.loads(reply)["error"], reply
    assert client.infer(_json_request(_inputs(9)))[0] == 200


def test_a_nan_in_binary_data_reaches_the_model_as_in_triton(client: Client, reference: ort.InferenceSession) -> None:
    """Binary tensors pass as they are (perf_analyzer's random FP32 data holds NaN bit patterns); the
    NaN comes back in binary output, which carries IEEE floats."""
    inputs = _inputs(14)
    inputs["x"][1, 2] = np.nan
    request = {"inputs": [{"name": k, "shape": list(v.shape), "datatype": {"x": "FP32", "ids": "INT64"}[k],
                           "parameters": {"binary_data_size": v.nbytes}} for k, v in inputs.items()],
               "parameters": {"binary_data_output": True}}
    status, headers, reply = client.infer(request, inputs["x"].tobytes() + inputs["ids"].tobytes())
    assert status == 200, reply
    got, want = _binary_outputs(headers, reply), _expected(reference, inputs)
    assert np.isnan(got["y"][1]).all() and np.allclose(got["y"][0], want["y"][0], rtol=0, atol=1e-6)


def _strict_json(body: bytes) -> dict:
    """json.loads that refuses NaN and Infinity, which RFC 8259 JSON does not have."""
    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} in the response: not JSON")
    return json.loads(body, parse_constant=refuse)


def test_outputs_json_cannot_carry_fail_with_500_or_come_as_binary(tmp_path: Path) -> None:
    """log(-1) is NaN, log(0) -Inf: never written as bare NaN; binary data carries them."""
    with Served(Runtime(_bundle(tmp_path / "log", _log_model(tmp_path / "log.onnx"), "log"))) as served:
        c = Client(served.port)
        x = np.array([[1.0, -1.0], [0.0, 2.0]], np.float32)
        request = {"inputs": [{"name": "x", "shape": [2, 2], "datatype": "FP32", "data": x.ravel().tolist()}]}
        status, headers, body = c.infer(request, model="log")
        assert status == 500 and headers["content-type"] == "application/json"
        error = _strict_json(body)["error"]
        assert "output 'y' holds NaN or infinite values" in error and "binary" in error
        status, headers, body = c.infer({**request, "parameters": {"binary_data_output": True}}, model="log")
        assert status == 200, body
        y = _binary_outputs(headers, body)["y"]
        assert np.isnan(y[0, 1]) and y[1, 0] == -np.inf and y[1, 1] == pytest.approx(np.log(2))
        finite = {"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1.0, np.e]}]}
        status, _, body = c.infer(finite, model="log")
        assert status == 200 and _strict_json(body)["outputs"][0]["data"] == pytest.approx([0.0, 1.0])
        metrics = _metrics(c)
        c.close()
    # the 500: the runtime ran it, the server could not write it
    assert _counter(metrics, "nv_inference_request_failure", reason="OTHER") == 1
    assert _counter(metrics, "nv_inference_request_failure", reason="BACKEND") == 0


def test_gzip_and_deflate_bodies_are_inflated_within_the_limit(client: Client, reference: ort.InferenceSession) -> None:
    inputs = _inputs(15)
    body = json.dumps(_json_request(inputs)).encode()
    url = f"/v2/models/{MODEL}/infer"
    for encoding, packed in (("gzip", gzip.compress(body)), ("deflate", zlib.compress(body)), ("identity", body)):
        status, _, reply = client.call("POST", url, packed, {"Content-Encoding": encoding})
        assert status == 200, (encoding, reply)
        want = _expected(reference, inputs)["y"].ravel()
        np.testing.assert_allclose(json.loads(reply)["outputs"][0]["data"], want, rtol=1e-6)
    head = json.dumps({"inputs": [{"name": k, "shape": list(v.shape), "datatype": {"x": "FP32", "ids": "INT64"}[k],
                                   "parameters": {"binary_data_size": v.nbytes}} for k, v in inputs.items()]}).encode()
    binary = gzip.compress(head + inputs["x"].tobytes() + inputs["ids"].tobytes())  # header length: before compression
    headers = {"Content-Encoding": "gzip", "Inference-Header-Content-Length": str(len(head))}
    status, _, reply = client.call("POST", url, binary, headers)
    assert status == 200, reply
    bomb = gzip.compress(b" " * (MAX_BODY + 1))  # about a kilobyte that inflates past the 1 MiB limit
    assert len(bomb) < 10_000
    refused = {
        "bomb": (bomb, "gzip", 413, "inflates to more than the limit"),
        "corrupt": (b"\x1f\x8b\x08\x00garbage-garbage", "gzip", 400, "corrupt gzip body"),
        "truncated": (gzip.compress(body)[:-12], "gzip", 400, "truncated gzip body"),
        "unknown encoding": (body, "br", 415, "Content-Encoding 'br' is not supported"),
    }
    for case, (payload, encoding, want, message) in refused.items():
        status, _, reply = client.call("POST", url, payload, {"Content-Encoding": encoding})
        assert status == want and message in json.loads(reply)["error"], (case, status, reply)
    assert client.infer(_json_request(_inputs(16)))[0] == 200  # the same keep-alive connection serves on


def test_the_default_body_limit_is_a_full_batch_written_as_json(tiny: Path) -> None:
    config = bundle.read(tiny)  # 8 rows of 7 numbers: far under the floor
    assert body_limit(config) == MIN_BODY_BYTES == InferenceServer(Runtime(tiny)).max_body_bytes
    wide = config.model_copy(update={"max_batch_size": 16,
                                     "inputs": [bundle.TensorSpec(name="x", dtype="float32", shape=[-1, 8192])]})
    assert body_limit(wide) == 16 * 8192 * JSON_BYTES_PER_ELEMENT
    worst = np.random.default_rng(0).standard_normal((16, 8192)).astype(np.float32) * np.float32(-1e-20)  # long reprs
    body = json.dumps({"id": "a-full-batch", "inputs": [{"name": "x", "shape": [16, 8192], "datatype": "FP32",
                                                         "data": worst.tolist()}]}).encode()
    assert body_limit(wide) > len(body) > MIN_BODY_BYTES
    fixed = wide.model_copy(update={"inputs": [bundle.TensorSpec(name="x", dtype="float32", shape=[8, 8192])]})
    assert body_limit(fixed) == 8 * 8192 * JSON_BYTES_PER_ELEMENT  # a fixed batch dim bounds the rows
    text = wide.model_copy(update={"inputs": [bundle.TensorSpec(name="ids", dtype="int64", shape=[-1, -1])]})
    assert body_limit(text) == MAX_BODY_BYTES  # a dynamic sequence length: no size to derive


def test_unknown_model_version_path_and_method(client: Client) -> None:
    status, _, body = client.infer(_json_request(_inputs(10)), model="other")
    assert status == 404 and "unknown model 'other'" in json.loads(body)["error"]
    assert client.call("GET", f"/v2/models/{MODEL}/versions/2")[0] == 404
    assert client.call("GET", "/v3/whatever")[0] == 404
    assert client.call("GET", f"/v2/models/{MODEL}/infer")[0] == 405
    assert client.infer(_json_request(_inputs(10)))[0] == 200


def test_body_over_the_limit_is_413_before_it_is_read(client: Client, server: Served) -> None:
    status, _, body = client.call("POST", f"/v2/models/{MODEL}/infer", b" " * (MAX_BODY + 1))
    assert status == 413 and "over the limit" in json.loads(body)["error"]
    assert client.infer(_json_request(_inputs(11)))[0] == 200
    chunked = Client(server.port)  # no Content-Length: counted while reading
    chunked.conn.request("POST", f"/v2/models/{MODEL}/infer", body=iter([b" " * 65536] * 20), encode_chunked=True)
    response = chunked.conn.getresponse()
    assert response.status == 413 and "over the limit" in json.loads(response.read())["error"]
    chunked.close()
    assert client.infer(_json_request(_inputs(12)))[0] == 200



@pytest.mark.parametrize("zeros", [30, 4400], ids=["30-zeros", "4400-zeros"])
def test_a_binary_header_length_with_leading_zeros_is_still_its_length(client: Client, reference: ort.InferenceSession,
                                                                       zeros: int) -> None:
    """The digit count is checked without leading zeros: the limit on digits refuses no valid length. Past
    int()'s 4,300 digits the padded length was a 500 and a traceback in the server's log (#36.7)."""
    inputs = _inputs(14)
    head = json.dumps({"inputs": [{"name": k, "shape": list(v.shape), "datatype": {"x": "FP32", "ids": "INT64"}[k],
                                   "parameters": {"binary_data_size": v.nbytes}} for k, v in inputs.items()]}).encode()
    headers = {"Inference-Header-Content-Length": "0" * zeros + str(len(head))}
    status, reply_headers, body = client.call("POST", f"/v2/models/{MODEL}/infer",
                                              head + inputs["x"].tobytes() + inputs["ids"].tobytes(), headers)
    assert status == 200, body
    want = _expected(reference, inputs)
    got = json.loads(body)["outputs"]
    assert np.allclose(np.array(got[0]["data"]).reshape(2, 2), want["y"], atol=1e-6)
