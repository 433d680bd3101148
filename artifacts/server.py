"""`temper serve`: the Open Inference Protocol (KServe v2) REST API for one serving bundle.

A bare ASGI app run by uvicorn (httptools + uvloop when installed), not a web framework: on a
small model the HTTP stack is most of a request's cost (DESIGN.md, "Serving: what was
measured"), so routing is a few string compares, responses are pre-encoded where they can be,
and the access log is off. Clients that care about speed send and receive tensors with
Triton's binary tensor data extension, which keeps JSON down to a short header; plain JSON
works for everyone else. Batching, the bounded queue and timeouts are the Runtime's; for a
model the Runtime found tiny, a request that arrives alone runs inline on the event loop.

Status codes, each with a body {"error": "<one line>"} and the server serving on afterwards:
  400  malformed JSON or binary framing; unknown, missing or repeated input; wrong datatype;
       a shape the model does not take; data not matching its shape; batch over max_batch_size
  404  unknown model, version or path        405  wrong method
  413  body larger than `max_body_bytes` (refused from Content-Length, before reading it)
  503  overloaded (queue full) or not ready yet
  504  accepted but not answered within the bundle's timeout_s
  500  the engine itself failed
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from typing import Any

import numpy as np

from artifacts.bundle import TensorSpec
from artifacts.runtime import Overloaded, RequestError, RequestTimeout, Runtime

MAX_BODY_BYTES = 64 * 1024 * 1024
VERSION = "1"
# numpy dtype name -> KServe v2 datatype name
DATATYPES = {"float32": "FP32", "float16": "FP16", "int64": "INT64", "int32": "INT32", "int8": "INT8", "uint8": "UINT8", "bool": "BOOL"}
WIRE = {kserve: np.dtype(name).newbyteorder("<") for name, kserve in DATATYPES.items()}  # binary data is little-endian
BINARY_HEADER = b"inference-header-content-length"
JSON_TYPE = (b"content-type", b"application/json")
METRICS_TYPE = (b"content-type", b"text/plain; version=0.0.4; charset=utf-8")

log = logging.getLogger(__name__)
Response = tuple[int, list[tuple[bytes, bytes]], bytes]


class HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class InferenceServer:
    """ASGI app serving one Runtime; the lifespan starts it (warm-up included) and stops it."""

    def __init__(self, runtime: Runtime, max_body_bytes: int = MAX_BODY_BYTES) -> None:
        self.runtime, self.max_body_bytes = runtime, max_body_bytes
        config = runtime.config
        self.name, self.timeout_s = config.name, config.timeout_s
        self.rejected = 0  # infer requests refused before reaching the runtime; only the event loop writes it
        self.arriving = 0  # infer requests between their last body byte and the runtime; event loop only
        self.inputs = {spec.name: spec for spec in config.inputs}
        self.outputs = [spec.name for spec in config.outputs]
        self.metadata = _encode({
            "name": self.name, "versions": [VERSION], "platform": "onnxruntime",
            "inputs": _tensors(config.inputs), "outputs": _tensors(config.outputs),
        })
        self.server_metadata = _encode({"name": "temper", "version": VERSION, "extensions": ["binary_tensor_data"]})
        self.labels = 'model="{}",version="{}"'.format(self.name.replace("\\", "\\\\").replace('"', '\\"'), VERSION)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            status, headers, body = await self._handle(scope, receive)
            headers.append((b"content-length", str(len(body)).encode()))
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": body})
        elif scope["type"] == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await asyncio.to_thread(self.runtime.start)
                except Exception as exc:  # noqa: BLE001 - any start-up failure: uvicorn prints the message and exits non-zero
                    await send({"type": "lifespan.startup.failed", "message": f"cannot start {self.name}: {type(exc).__name__}: {exc}"})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await asyncio.to_thread(self.runtime.stop)
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _handle(self, scope: dict, receive: Any) -> Response:
        try:
            return await self._route(scope, receive)
        except HttpError as exc:
            return _error(exc.status, str(exc))
        except RequestError as exc:
            return _error(400, str(exc))
        except Overloaded as exc:
            return _error(503, str(exc))
        except RequestTimeout as exc:
            return _error(504, str(exc))
        except Exception as exc:
            log.exception("inference failed")
            return _error(500, f"{type(exc).__name__}: {exc}")

    async def _route(self, scope: dict, receive: Any) -> Response:
        method, path = scope["method"], scope["path"]
        if path.startswith("/v2/models/"):
            name, _, action = path[len("/v2/models/"):].partition("/")
            if name != self.name:
                raise HttpError(404, f"unknown model '{name}'; this server serves '{self.name}'")
            if action.startswith("versions/"):
                version, _, action = action[len("versions/"):].partition("/")
                if version != VERSION:
                    raise HttpError(404, f"model '{name}' has no version '{version}'; it has version {VERSION}")
            if action == "infer":
                _allow(method, "POST")
                return await self._infer(scope, receive)
            if action == "":
                _allow(method, "GET")
                return 200, [JSON_TYPE], self.metadata
            if action == "ready":
                _allow(method, "GET")
                return self._ready()
        elif path == "/v2/health/live":
            _allow(method, "GET")
            return 200, [], b""
        elif path == "/v2/health/ready":
            _allow(method, "GET")
            return self._ready()
        elif path == "/metrics":
            _allow(method, "GET")
            return 200, [METRICS_TYPE], self.metrics_text().encode()
        elif path in ("/v2", "/v2/"):
            _allow(method, "GET")
            return 200, [JSON_TYPE], self.server_metadata
        raise HttpError(404, f"no such endpoint: {method} {path}")

    def _ready(self) -> Response:
        return (200, [], b"") if self.runtime.ready else _error(503, f"model '{self.name}' is not ready")

    async def _infer(self, scope: dict, receive: Any) -> Response:
        try:
            headers = dict(scope["headers"])
            body = await self._body(headers, receive)
            request, binary = _split(body, headers.get(BINARY_HEADER))
            inputs = self._decode_inputs(request, binary)
            wanted = self._wanted_outputs(request)
            if not self.runtime.ready:
                raise HttpError(503, f"model '{self.name}' is not ready")
        except (HttpError, RequestError):
            self.rejected += 1  # never reached the runtime, which counts everything after this
            raise
        future = self.runtime.submit(inputs, inline=await self._alone())  # RequestError, Overloaded
        if future.done():  # ran inline: no hand-off back to the event loop to wait for
            return self._encode_outputs(request, future.result(), wanted)
        try:
            results = await asyncio.wait_for(asyncio.wrap_future(future), self.timeout_s)
        except asyncio.TimeoutError:  # wait_for cancelled the future: a still-queued request is dropped
            raise RequestTimeout(f"not answered within {self.timeout_s}s") from None
        return self._encode_outputs(request, results, wanted)

    async def _alone(self) -> bool:
        """Whether this request may run inline: the model is tiny and no other request reached
        this point in the same turn of the event loop.

        Requests that arrive together all get here before any of them resumes from the yield,
        so they see each other and go to the batcher to share a batch. Running them inline one
        by one would serialise every run on the event loop. Slow models never yield here.
        """
        if not self.runtime.inline:
            return False
        self.arriving += 1
        try:
            await asyncio.sleep(0)
            return self.arriving == 1
        finally:
            self.arriving -= 1

    async def _body(self, headers: dict[bytes, bytes], receive: Any) -> bytes:
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            raise HttpError(413, f"request body of {int(declared):,} bytes is over the limit of {self.max_body_bytes:,}")
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise HttpError(400, "the client disconnected before sending the whole body")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:  # chunked uploads carry no Content-Length
                raise HttpError(413, f"request body is over the limit of {self.max_body_bytes:,} bytes")
            chunks.append(chunk)
            if not message.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def _decode_inputs(self, request: dict, binary: memoryview) -> dict[str, np.ndarray]:
        items = request.get("inputs")
        if not isinstance(items, list):
            raise RequestError('the request needs an "inputs" list')
        inputs: dict[str, np.ndarray] = {}
        offset = 0
        for item in items:
            if not isinstance(item, dict):
                raise RequestError("each input must be an object with name, shape, datatype and data")
            name = item.get("name")
            spec = self.inputs.get(name) if isinstance(name, str) else None
            if spec is None:
                raise RequestError(f"unknown input {name!r}; the model takes {', '.join(self.inputs)}")
            if name in inputs:
                raise RequestError(f"input '{name}' is given twice")
            datatype, shape = item.get("datatype"), item.get("shape")
            if datatype != DATATYPES[spec.dtype]:
                raise RequestError(f"input '{name}': datatype {datatype!r} does not match the model's {DATATYPES[spec.dtype]}")
            if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
                raise RequestError(f"input '{name}': shape must be a list of non-negative integers, got {shape!r}")
            dtype, count = WIRE[datatype], math.prod(shape)
            size = _binary_size(item)
            if size is None:
                if "data" not in item:
                    raise RequestError(f"input '{name}' has neither data nor parameters.binary_data_size")
                try:
                    array = np.asarray(item["data"], dtype=dtype)
                except (ValueError, TypeError, OverflowError) as exc:
                    raise RequestError(f"input '{name}': data is not {datatype}: {exc}") from None
                if array.size != count:
                    raise RequestError(f"input '{name}': {array.size} data elements for shape {shape} ({count} elements)")
            else:
                if size != count * dtype.itemsize:
                    raise RequestError(f"input '{name}': binary_data_size {size} for shape {shape} of {datatype} ({count * dtype.itemsize} bytes)")
                if offset + size > len(binary):
                    raise RequestError(f"input '{name}': the body ends {offset + size - len(binary)} bytes before its binary data does")
                array = np.frombuffer(binary, dtype=dtype, count=count, offset=offset)
                offset += size
            inputs[name] = array.reshape(shape)
        if offset != len(binary):
            raise RequestError(f"{len(binary) - offset} bytes of binary data follow the JSON that no input claims")
        return inputs

    def _wanted_outputs(self, request: dict) -> list[tuple[str, bool]]:
        """(output name, as binary) in the order the response lists them."""
        params = request.get("parameters")
        default = bool(params.get("binary_data_output", False)) if isinstance(params, dict) else False
        asked = request.get("outputs")
        if asked is None:
            return [(name, default) for name in self.outputs]
        if not isinstance(asked, list):
            raise RequestError('"outputs" must be a list of objects with a name')
        wanted = []
        for item in asked:
            name = item.get("name") if isinstance(item, dict) else None
            if name not in self.outputs:
                raise RequestError(f"unknown output {name!r}; the model gives {', '.join(self.outputs)}")
            params = item.get("parameters")
            wanted.append((name, bool(params.get("binary_data", default)) if isinstance(params, dict) else default))
        return wanted

    def _encode_outputs(self, request: dict, results: dict[str, np.ndarray], wanted: list[tuple[str, bool]]) -> Response:
        outputs, blobs = [], []
        for name, as_binary in wanted:
            array = results[name]
            entry: dict[str, Any] = {"name": name, "datatype": DATATYPES[array.dtype.name], "shape": list(array.shape)}
            if as_binary:
                blob = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
                entry["parameters"] = {"binary_data_size": len(blob)}
                blobs.append(blob)
            else:
                entry["data"] = array.ravel().tolist()
            outputs.append(entry)
        reply: dict[str, Any] = {"model_name": self.name, "model_version": VERSION, "outputs": outputs}
        if "id" in request:
            reply["id"] = request["id"]
        head = _encode(reply)
        if not blobs:
            return 200, [JSON_TYPE], head
        headers = [(b"content-type", b"application/octet-stream"), (BINARY_HEADER, str(len(head)).encode())]
        return 200, headers, b"".join([head, *blobs])

    def metrics_text(self) -> str:
        """Prometheus exposition text; counter names follow Triton's so its dashboards work.

        nv_inference_request_failure adds the requests this server turned away before they
        reached the runtime (malformed body, unknown input, too large) to the runtime's own.
        """
        m = self.runtime.metrics.snapshot()
        lines: list[str] = []

        def counter(name: str, help_text: str, value: int) -> None:
            lines.extend((f"# HELP {name} {help_text}", f"# TYPE {name} counter", f"{name}{{{self.labels}}} {value}"))

        counter("nv_inference_request_success", "Number of successful inference requests", m["request_success"])
        counter("nv_inference_request_failure", "Number of failed inference requests", m["request_failure"] + self.rejected)
        counter("nv_inference_count", "Number of inferences performed (a batch of n rows counts n)", m["inference_count"])
        counter("nv_inference_exec_count", "Number of model executions (batches) performed", m["execution_count"])
        counter("nv_inference_queue_duration_us", "Cumulative time requests waited in the queue, in microseconds", m["queue_ns"] // 1000)
        counter("nv_inference_compute_infer_duration_us", "Cumulative model execution time per request, in microseconds", m["compute_ns"] // 1000)
        counter("temper_inline_exec_count", "Executions run inline on the event loop instead of by the batcher", m["inline_count"])
        r = self.runtime
        info = f'{self.labels},engine="{r.engine}",intra_op_threads="{r.intra_op_threads}",inline="{str(r.inline).lower()}"'
        lines.extend(("# HELP temper_runtime_info What start-up chose: engine, intra-op threads, inline runs (value 1)",
                      "# TYPE temper_runtime_info gauge", f"temper_runtime_info{{{info}}} 1"))
        name = "temper_request_duration_seconds"
        lines.extend((f"# HELP {name} Time from queueing to answer of successful inference requests", f"# TYPE {name} histogram"))
        for bound_ms, count in zip(m["latency_buckets_ms"], m["latency_counts"]):
            lines.append(f'{name}_bucket{{{self.labels},le="{float(bound_ms) / 1000!r}"}} {count}')
        lines.append(f'{name}_bucket{{{self.labels},le="+Inf"}} {m["latency_count"]}')
        lines.append(f"{name}_sum{{{self.labels}}} {m['latency_sum_ms'] / 1000!r}")
        lines.append(f"{name}_count{{{self.labels}}} {m['latency_count']}")
        return "\n".join(lines) + "\n"


def _tensors(specs: list[TensorSpec]) -> list[dict[str, Any]]:
    return [{"name": s.name, "datatype": DATATYPES[s.dtype], "shape": s.shape} for s in specs]


def _allow(method: str, allowed: str) -> None:
    if method != allowed:
        raise HttpError(405, f"method {method} not allowed here; use {allowed}")


def _split(body: bytes, header_length: bytes | None) -> tuple[dict, memoryview]:
    """The JSON request header and the binary tensor data after it (Triton's binary data extension)."""
    view = memoryview(body)
    end = len(body)
    if header_length is not None:
        if not header_length.isdigit() or int(header_length) > len(body):
            raise RequestError(f"Inference-Header-Content-Length {header_length.decode(errors='replace')!r} is not a length within the {len(body)}-byte body")
        end = int(header_length)
    try:
        request = json.loads(view[:end].tobytes() if end < len(body) else body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RequestError(f"malformed JSON: {exc}") from None
    if not isinstance(request, dict):
        raise RequestError("the request must be a JSON object")
    return request, view[end:]


def _binary_size(item: dict) -> int | None:
    params = item.get("parameters")
    if not isinstance(params, dict) or "binary_data_size" not in params:
        return None
    size = params["binary_data_size"]
    if type(size) is not int or size < 0:
        raise RequestError(f"input '{item['name']}': binary_data_size must be a non-negative integer, got {size!r}")
    return size


def _encode(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _error(status: int, message: str) -> Response:
    return status, [JSON_TYPE], _encode({"error": message})


def serve(runtime: Runtime, host: str = "127.0.0.1", port: int = 8000, max_body_bytes: int = MAX_BODY_BYTES) -> None:
    """Serve until interrupted; the runtime warms up before the port accepts requests.

    uvicorn picks httptools and uvloop when they are installed (measured 1.38x on a tiny model).
    """
    import uvicorn

    uvicorn.run(InferenceServer(runtime, max_body_bytes), host=host, port=port, lifespan="on", access_log=False,
                log_level="warning", server_header=False, date_header=False)
