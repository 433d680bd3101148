"""`temper serve`: the Open Inference Protocol (KServe v2) REST API for one serving bundle.

A bare ASGI app run by uvicorn (httptools + uvloop), not a web framework: on a small model the
HTTP stack is most of a request's cost (benchmarks/serving.py measured it), so routing is a
few string compares, responses are pre-encoded where they can be, and the access log is off.
Clients that care about speed send and receive tensors with Triton's binary tensor data
extension, which keeps JSON down to a short header; plain JSON works for everyone else. Batching,
the bounded queue and timeouts are the Runtime's; for a model the Runtime found tiny, a request
that arrives alone runs inline on the event loop. Besides inference: health, model metadata,
Triton's model configuration (`/config`) and statistics (`/stats`) extensions, and `/metrics`.

Connections. uvicorn alone keeps a connection that sends nothing, or half its headers, open
forever, until the process runs out of file descriptors and accept() fails for everyone. Here a
connection must complete each request's headers within `header_timeout_s` (from its opening, or
from the first byte of a keep-alive request) and its body within `body_timeout_s`, or it is
closed; an idle keep-alive connection is closed after `keep_alive_s`. At most `max_connections`
are open (by default what the open-file limit leaves room for): one more closes the connection
that has waited longest for a request, or, when every connection is in the middle of one, is
answered 503 and closed.

Bodies. JSON is decoded by orjson straight into numpy arrays; bodies over INLINE_BODY_BYTES (and
every compressed one) are decoded on one worker thread, so a large body never holds up the event
loop and at most one body's Python objects exist at a time. The body limit defaults to a full
batch of the model's inputs written as JSON text (body_limit). `Content-Encoding: gzip` or
`deflate` bodies are inflated up to that same limit.

Non-finite numbers: JSON (RFC 8259) has no NaN or Infinity. Float inputs holding them are refused
with 400 (the Runtime's check: an INT8 model would answer them with plausible numbers). An output
holding them cannot be written as JSON: the request fails with 500 saying so, unless it asked for
that output as binary data, which carries IEEE floats as they are.

Status codes, each with a body {"error": "<one line>"} and the server serving on afterwards:
  400  malformed JSON (nesting too deep included) or binary framing; unknown, missing or repeated
       input; wrong datatype; a shape the model does not take; data not matching its shape; NaN or
       Inf in a float input; batch over max_batch_size; a corrupt compressed body
  404  unknown model, version or path        405  wrong method
  413  body larger than `max_body_bytes` (refused from Content-Length, before reading it), or
       inflating to more than that
  415  a Content-Encoding other than gzip, deflate or identity
  500  the engine itself failed, or an output JSON-encoded holds NaN or Inf
  503  overloaded (queue full), not ready yet, or every connection busy at the connection limit
  504  accepted but not answered within the bundle's timeout_s
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import math
import os
import resource
import socket
import zlib
from collections import Counter
from typing import Any

import numpy as np
import orjson
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from artifacts.bundle import ServingConfig, TensorSpec
from artifacts.metrics import Exposition
from artifacts.runtime import Overloaded, RequestError, RequestTimeout, Runtime
from artifacts.triton import _model_config

VERSION = "1"
# numpy dtype name -> KServe v2 datatype name
DATATYPES = {"float32": "FP32", "float16": "FP16", "int64": "INT64", "int32": "INT32", "int8": "INT8",
             "uint8": "UINT8", "bool": "BOOL"}
WIRE = {kserve: np.dtype(name).newbyteorder("<") for name, kserve in DATATYPES.items()}  # binary data is little-endian
BINARY_HEADER = b"inference-header-content-length"
JSON_TYPE = (b"content-type", b"application/json")
PLATFORM = "onnxruntime_onnx"  # Triton's name for what runs the model

MAX_BODY_BYTES = 64 * 1024 * 1024  # the body limit when a dynamic non-batch dim leaves the size unknown
MIN_BODY_BYTES = 1024 * 1024
JSON_BYTES_PER_ELEMENT = 32  # the longest JSON number (-2.2250738585072014e-308, 24 chars), a separator, brackets
INLINE_BODY_BYTES = 64 * 1024  # larger bodies are decoded on the worker thread
INLINE_OUTPUT_ELEMENTS = 64 * 1024  # more output elements to write as JSON: encoded on the worker thread
INFLATE = {b"gzip": 32 + 15, b"x-gzip": 32 + 15, b"deflate": 32 + 15}  # zlib wbits: gzip or zlib header, detected

HEADER_TIMEOUT_S = 5.0
BODY_TIMEOUT_S = 60.0
KEEP_ALIVE_S = 5
MAX_CONNECTIONS = 4096  # the default's ceiling, when the open-file limit allows more
FD_RESERVE = 64  # file descriptors kept free for the model, logs and the listening socket
TOO_MANY_CONNECTIONS = b'{"error":"too many connections, all of them busy; try again shortly"}'
REFUSED = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\n"
           b"content-length: %d\r\n\r\n%s" % (len(TOO_MANY_CONNECTIONS), TOO_MANY_CONNECTIONS))

log = logging.getLogger(__name__)
Response = tuple[int, list[tuple[bytes, bytes]], bytes]
Decoded = tuple[str | None, dict[str, np.ndarray], list[tuple[str, bool]]]  # request id, inputs, wanted outputs


class HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def body_limit(config: ServingConfig) -> int:
    """The default request body limit: a full batch of every input written as JSON text, the
    largest form a valid request takes (binary tensor data is 3-30x smaller), at least
    MIN_BODY_BYTES. MAX_BODY_BYTES when an input has a dynamic non-batch dim (a sequence
    length): the model does not bound the size then."""
    fixed = [s.shape[0] for s in config.inputs if s.shape and s.shape[0] > 0]
    rows = min([config.max_batch_size, *fixed])
    if any(d < 0 for s in config.inputs for d in s.shape[1:]):
        return MAX_BODY_BYTES
    elements = sum(math.prod(s.shape[1:]) for s in config.inputs)
    return max(MIN_BODY_BYTES, rows * elements * JSON_BYTES_PER_ELEMENT)


def connection_limit() -> int:
    """The most connections the open-file limit leaves room for, beside the descriptors already
    open and FD_RESERVE, capped at MAX_CONNECTIONS: at the limit the server makes room itself,
    instead of accept() failing with EMFILE for every client."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS
    return max(1, min(MAX_CONNECTIONS, soft - len(os.listdir("/dev/fd")) - FD_RESERVE))


class Connections:
    """The open connections and, in the order they began waiting, those waiting for a request.
    Event loop only."""

    def __init__(self, limit: int, header_timeout_s: float, body_timeout_s: float) -> None:
        self.limit = limit
        self.timeouts = {"header_timeout": header_timeout_s, "body_timeout": body_timeout_s}
        self.open = 0
        self.waiting: dict[GuardedProtocol, None] = {}  # insertion order: longest waiting first
        self.closed: Counter[str] = Counter()  # connections this server closed, by reason

    def opened(self, connection: GuardedProtocol) -> bool:
        """Count a new connection; over the limit, close the longest waiting one, or say (False)
        that this one must be refused because every other is busy with a request."""
        self.open += 1
        if self.open > self.limit:
            if not self.waiting:
                self.closed["refused"] += 1
                return False
            oldest = next(iter(self.waiting))
            del self.waiting[oldest]
            self.closed["evicted"] += 1
            oldest.transport.close()
        self.waiting[connection] = None
        return True

    def busy(self, connection: GuardedProtocol) -> None:
        self.waiting.pop(connection, None)

    def idle(self, connection: GuardedProtocol) -> None:
        self.waiting.pop(connection, None)
        self.waiting[connection] = None

    def lost(self, connection: GuardedProtocol) -> None:
        self.open -= 1
        self.waiting.pop(connection, None)


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol plus what it lacks: deadlines for a request's headers and body,
    and the connection limit. uvicorn's own keep-alive timer closes idle keep-alive connections.

    A deadline is armed only when a read ends part-way through a request, so a request that
    arrives whole in one read (nearly all) sets no timer at all.
    """

    def __init__(self, *args: Any, connections: Connections, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.guard = connections
        self.reading: str | None = None  # what the request being read would be late with: its headers or body
        self.deadline: asyncio.TimerHandle | None = None
        self.deadline_for: str | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if self.guard.opened(self):
            self._arm("header_timeout")  # a new connection owes its first request's headers from now
        else:
            transport.write(REFUSED)
            transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self.guard.lost(self)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.reading is not None and self.reading != self.deadline_for and not self.transport.is_closing():
            self._arm(self.reading)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.reading = "header_timeout"

    def on_headers_complete(self) -> None:
        self.guard.busy(self)
        self.reading = "body_timeout"
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self.reading = None
        self._disarm()
        super().on_message_complete()

    def on_response_complete(self) -> None:
        pipelined = bool(self.pipeline)
        super().on_response_complete()
        if not pipelined and not self.transport.is_closing():
            self.guard.idle(self)

    def _arm(self, reason: str) -> None:
        self._disarm()
        self.deadline = self.loop.call_later(self.guard.timeouts[reason], self._expire, reason)
        self.deadline_for = reason

    def _disarm(self) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = self.deadline_for = None

    def _expire(self, reason: str) -> None:
        self.deadline = self.deadline_for = None
        if not self.transport.is_closing():
            self.guard.closed[reason] += 1
            self.transport.close()


class InferenceServer:
    """ASGI app serving one Runtime; the lifespan starts it (warm-up included) and stops it.

    `max_body_bytes` None: body_limit(config). `max_connections` None: connection_limit().
    """

    def __init__(self, runtime: Runtime, max_body_bytes: int | None = None, max_connections: int | None = None,
                 header_timeout_s: float = HEADER_TIMEOUT_S, body_timeout_s: float = BODY_TIMEOUT_S,
                 keep_alive_s: float = KEEP_ALIVE_S) -> None:
        self.runtime = runtime
        config = runtime.config
        self.max_body_bytes = max_body_bytes or body_limit(config)
        self.connections = Connections(max_connections or connection_limit(), header_timeout_s, body_timeout_s)
        self.keep_alive_s = keep_alive_s
        self.name, self.timeout_s = config.name, config.timeout_s
        self.failed = 0  # infer requests failed here: refused before the runtime, or unwritable after it; loop only
        self.arriving = 0  # infer requests between their last body byte and the runtime; event loop only
        self.worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="temper-decode")
        self.inputs = {spec.name: spec for spec in config.inputs}
        self.outputs = [spec.name for spec in config.outputs]
        self.metadata = _encode({
            "name": self.name, "versions": [VERSION], "platform": PLATFORM,
            "inputs": _tensors(config.inputs), "outputs": _tensors(config.outputs),
        })
        self.server_metadata = _encode({"name": "temper", "version": VERSION,
                                        "extensions": ["binary_tensor_data", "model_configuration", "statistics"]})
        self.exposition = Exposition(self)

    def uvicorn_config(self, **options: Any) -> uvicorn.Config:
        """uvicorn settings that serve this app through GuardedProtocol; `options` override them."""
        protocol = functools.partial(GuardedProtocol, connections=self.connections)
        settings: dict[str, Any] = dict(http=protocol, lifespan="on", timeout_keep_alive=self.keep_alive_s,
                                        access_log=False, log_level="warning", server_header=False, date_header=False)
        return uvicorn.Config(self, **(settings | options))

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
                except Exception as exc:  # noqa: BLE001 - any start-up failure: uvicorn prints it and exits non-zero
                    await send({"type": "lifespan.startup.failed",
                                "message": f"cannot start {self.name}: {type(exc).__name__}: {exc}"})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                self.worker.shutdown(wait=False, cancel_futures=True)
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
            if name == "stats" and not action and name != self.name:  # statistics of every model: this one
                _allow(method, "GET")
                return 200, [JSON_TYPE], _encode(self._stats())
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
            if action == "config":
                _allow(method, "GET")
                return 200, [JSON_TYPE], _encode(self._model_config())
            if action == "stats":
                _allow(method, "GET")
                return 200, [JSON_TYPE], _encode(self._stats())
        elif path == "/v2/health/live":
            _allow(method, "GET")
            return 200, [], b""
        elif path == "/v2/health/ready":
            _allow(method, "GET")
            return self._ready()
        elif path == "/metrics":
            _allow(method, "GET")
            accept = dict(scope["headers"]).get(b"accept", b"").decode("latin-1")
            body, content_type = self.exposition.render(accept)
            return 200, [(b"content-type", content_type.encode())], body
        elif path in ("/v2", "/v2/"):
            _allow(method, "GET")
            return 200, [JSON_TYPE], self.server_metadata
        raise HttpError(404, f"no such endpoint: {method} {path}")

    def _ready(self) -> Response:
        return (200, [], b"") if self.runtime.ready else _error(503, f"model '{self.name}' is not ready")

    def _model_config(self) -> dict[str, Any]:
        """Triton's model configuration (the JSON form of its ModelConfig), as `temper export-triton`
        writes it for this bundle, with the instance this server really runs."""
        kind = "KIND_GPU" if self.runtime.engine in ("cuda", "tensorrt") else "KIND_CPU"
        config = _model_config(self.runtime.config, PLATFORM, 1, kind)
        del config["model_warmup"]  # a repository setting; this server has warmed up already
        return {**config, "backend": "onnxruntime"}

    def _stats(self) -> dict[str, Any]:
        """Triton's statistics extension for this model. Counts are requests, times are summed
        per request (a request in a batch of 8 adds the whole batch's compute), as Triton does;
        batch_stats count executions per batch size. fail adds the requests this server refused
        before they reached the runtime."""
        m = self.runtime.metrics.snapshot()
        executed = m["executed_requests"]

        def duration(count: int, ns: int) -> dict[str, int]:
            return {"count": count, "ns": ns}

        model = {
            "name": self.name, "version": VERSION, "last_inference": m["last_inference_ms"],
            "inference_count": m["inference_count"], "execution_count": m["execution_count"],
            "inference_stats": {
                "success": duration(m["request_success"], m["success_ns"]),
                "fail": duration(m["request_failure"] + self.failed, m["failure_ns"]),
                "queue": duration(executed, m["queue_ns"]),
                "compute_input": duration(executed, m["compute_input_ns"]),
                "compute_infer": duration(executed, m["compute_ns"]),
                "compute_output": duration(executed, m["compute_output_ns"]),
                "cache_hit": duration(0, 0), "cache_miss": duration(0, 0),
            },
            "batch_stats": [
                {"batch_size": rows, "compute_input": duration(count, input_ns),
                 "compute_infer": duration(count, infer_ns), "compute_output": duration(count, output_ns)}
                for rows, (count, input_ns, infer_ns, output_ns) in m["batches"].items()
            ],
            "memory_usage": [],
        }
        return {"model_stats": [model]}

    async def _infer(self, scope: dict, receive: Any) -> Response:
        try:
            headers = dict(scope["headers"])
            body = await self._body(headers, receive)
            if len(body) > INLINE_BODY_BYTES or b"content-encoding" in headers:
                request_id, inputs, wanted = await self._on_worker(self._decode, body, headers)
            else:
                request_id, inputs, wanted = self._decode(body, headers)
            del body  # its JSON text is done with while the request waits (binary inputs are views that keep it)
            if not self.runtime.ready:
                raise HttpError(503, f"model '{self.name}' is not ready")
        except (HttpError, RequestError):
            self.failed += 1  # never reached the runtime, which counts everything after this
            raise
        future = self.runtime.submit(inputs, inline=await self._alone())  # RequestError, Overloaded
        if future.done():  # ran inline: no hand-off back to the event loop to wait for
            results = future.result()
        else:
            try:
                results = await asyncio.wait_for(asyncio.wrap_future(future), self.timeout_s)
            except TimeoutError:  # wait_for cancelled the future: a still-queued request is dropped
                raise RequestTimeout(f"not answered within {self.timeout_s}s") from None
        try:
            if sum(results[name].size for name, binary in wanted if not binary) > INLINE_OUTPUT_ELEMENTS:
                return await self._on_worker(self._encode_outputs, request_id, results, wanted)
            return self._encode_outputs(request_id, results, wanted)
        except HttpError:
            self.failed += 1
            raise

    async def _on_worker(self, call: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.worker, call, *args)

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

    async def _body(self, headers: dict[bytes, bytes], receive: Any) -> bytes | bytearray:
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            raise HttpError(413, f"request body of {int(declared):,} bytes is over the limit of "
                                 f"{self.max_body_bytes:,}")
        body: bytes | bytearray = b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise HttpError(400, "the client disconnected before sending the whole body")
            chunk = message.get("body", b"")
            if len(body) + len(chunk) > self.max_body_bytes:  # chunked uploads carry no Content-Length
                raise HttpError(413, f"request body is over the limit of {self.max_body_bytes:,} bytes")
            if not body:
                body = chunk
            else:  # one growing buffer, not a list of chunks joined at the end into a second copy
                body = body if isinstance(body, bytearray) else bytearray(body)
                body += chunk
            if not message.get("more_body", False):
                return body

    def _decode(self, body: bytes | bytearray, headers: dict[bytes, bytes]) -> Decoded:
        """The request's id, input arrays and wanted outputs; on the worker thread for large bodies.
        Returns no part of the parsed JSON, so its Python lists are freed before the request queues."""
        encoding = headers.get(b"content-encoding", b"identity").strip().lower()
        if encoding != b"identity":
            body = _inflate(body, encoding, self.max_body_bytes)
        request, binary = _split(body, headers.get(BINARY_HEADER))
        request_id = request.get("id")
        if request_id is not None and not isinstance(request_id, str):
            raise RequestError('"id" must be a string')
        return request_id, self._decode_inputs(request, binary), self._wanted_outputs(request)

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
                raise RequestError(f"input '{name}': datatype {datatype!r} does not match the model's "
                                   f"{DATATYPES[spec.dtype]}")
            if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
                raise RequestError(f"input '{name}': shape must be a list of non-negative integers, got {shape!r}")
            dtype, count = WIRE[datatype], math.prod(shape)
            size = _binary_size(item)
            if size is None:
                if "data" not in item:
                    raise RequestError(f"input '{name}' has neither data nor parameters.binary_data_size")
                try:
                    with np.errstate(over="ignore"):  # a float past its dtype's range: Inf, which the runtime refuses
                        array = np.asarray(item["data"], dtype=dtype)
                except (ValueError, TypeError, OverflowError) as exc:
                    raise RequestError(f"input '{name}': data is not {datatype}: {exc}") from None
                if array.size != count:
                    raise RequestError(f"input '{name}': {array.size} data elements for shape {shape} "
                                       f"({count} elements)")
            else:
                if size != count * dtype.itemsize:
                    raise RequestError(f"input '{name}': binary_data_size {size} for shape {shape} of {datatype} "
                                       f"({count * dtype.itemsize} bytes)")
                if offset + size > len(binary):
                    raise RequestError(f"input '{name}': the body ends {offset + size - len(binary)} bytes before "
                                       "its binary data does")
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

    def _encode_outputs(self, request_id: str | None, results: dict[str, np.ndarray],
                        wanted: list[tuple[str, bool]]) -> Response:
        outputs, blobs = [], []
        for name, as_binary in wanted:
            array = results[name]
            entry: dict[str, Any] = {"name": name, "datatype": DATATYPES[array.dtype.name], "shape": list(array.shape)}
            if as_binary:
                blob = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
                entry["parameters"] = {"binary_data_size": len(blob)}
                blobs.append(blob)
            elif array.dtype.kind == "f" and not np.isfinite(array).all():
                raise HttpError(500, f"output '{name}' holds NaN or infinite values, which JSON cannot carry; "
                                     "ask for it as binary data to receive them")
            else:
                entry["data"] = array.ravel()  # orjson writes a contiguous array without a Python list
            outputs.append(entry)
        reply: dict[str, Any] = {"model_name": self.name, "model_version": VERSION, "outputs": outputs}
        if request_id is not None:
            reply["id"] = request_id
        head = _encode(reply)
        if not blobs:
            return 200, [JSON_TYPE], head
        headers = [(b"content-type", b"application/octet-stream"), (BINARY_HEADER, str(len(head)).encode())]
        return 200, headers, b"".join([head, *blobs])


def _tensors(specs: list[TensorSpec]) -> list[dict[str, Any]]:
    return [{"name": s.name, "datatype": DATATYPES[s.dtype], "shape": s.shape} for s in specs]


def _allow(method: str, allowed: str) -> None:
    if method != allowed:
        raise HttpError(405, f"method {method} not allowed here; use {allowed}")


def _inflate(body: bytes | bytearray, encoding: bytes, limit: int) -> bytes:
    """A gzip or deflate body inflated, refused (413) as soon as it passes `limit` bytes."""
    wbits = INFLATE.get(encoding)
    if wbits is None:
        raise HttpError(415, f"Content-Encoding {encoding.decode(errors='replace')!r} is not supported; "
                             "send gzip, deflate or identity")
    inflater = zlib.decompressobj(wbits)
    try:
        data = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise RequestError(f"corrupt {encoding.decode()} body: {exc}") from None
    if len(data) > limit:
        raise HttpError(413, f"request body inflates to more than the limit of {limit:,} bytes")
    if not inflater.eof:
        raise RequestError(f"truncated {encoding.decode()} body")
    return data


def _split(body: bytes | bytearray, header_length: bytes | None) -> tuple[dict, memoryview]:
    """The JSON request header and the binary tensor data after it (Triton's binary data extension)."""
    view = memoryview(body)
    end = len(body)
    if header_length is not None:
        if not header_length.isdigit() or int(header_length) > len(body):
            raise RequestError(f"Inference-Header-Content-Length {header_length.decode(errors='replace')!r} "
                               f"is not a length within the {len(body)}-byte body")
        end = int(header_length)
    try:
        request = orjson.loads(view[:end])
    except orjson.JSONDecodeError as exc:
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
    return orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY)


def _error(status: int, message: str) -> Response:
    return status, [JSON_TYPE], _encode({"error": message})


def bind(host: str, port: int) -> socket.socket:
    """A socket bound to host:port, not yet listening: a busy port fails here (OSError), before
    anything says it is serving. Port 0 picks a free port."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                         flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    return sock


def serve(runtime: Runtime, sock: socket.socket, max_body_bytes: int | None = None,
          max_connections: int | None = None) -> None:
    """Serve on `sock` (from bind) until interrupted; the runtime warms up before requests are
    answered. uvicorn runs httptools and uvloop (measured 1.38x on a tiny model)."""
    app = InferenceServer(runtime, max_body_bytes, max_connections)
    try:
        uvicorn.Server(app.uvicorn_config()).run(sockets=[sock])
    except KeyboardInterrupt:  # uvicorn re-raises the Ctrl-C it shut down on; uvicorn.run() swallows it the same way
        pass
