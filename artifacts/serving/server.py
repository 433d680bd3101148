"""`temper serve`: the Open Inference Protocol (KServe v2) REST API for one serving bundle.

A bare ASGI app run by uvicorn (httptools + uvloop), not a web framework: on a small model the
HTTP stack is most of a request's cost (benchmarks/serving.py measured it), so routing is a
few string compares, responses are pre-encoded where they can be, and the access log is off.
Batching, the bounded queue and timeouts are the Runtime's; for a model the Runtime found tiny, a
request that arrives alone runs inline on the event loop. Besides inference: health, model
metadata, Triton's model configuration (`/config`) and statistics (`/stats`) extensions, and
`/metrics`.

This module routes requests and runs the app's lifespan; the parts it stands on are its neighbours in serving/:
  rest_codec.py         KServe v2 JSON and Triton's binary tensor data, in and out
  http_limits.py        body size, header size and count, header and body deadlines, the connection limit
  triton_extensions.py  the `/config` and `/stats` documents
  metrics.py            the `/metrics` exposition
  shm_http.py           Triton's shared-memory routes (/v2/systemsharedmemory/...), over
                        client_shm.py's regions

Bodies over INLINE_BODY_BYTES (and every compressed one) are decoded on one worker thread, so a
large body never holds up the event loop and at most one body's Python objects exist at a time.

Status codes, each with a body {"error": "<one line>"} and the server serving on afterwards:
  400  malformed JSON (nesting too deep included) or binary framing; unknown, missing or repeated
       input; wrong datatype; a shape the model does not take; data not matching its shape; NaN or
       Inf in a float input; batch over max_batch_size; a corrupt compressed body; a shared memory
       region not registered, an offset or size past its end, or shared memory while it is off
  403  the shared-memory routes while client shared memory is off (`--allow-client-shm` turns it on)
  404  unknown model, version or path        405  wrong method (HEAD is GET without the body)
  413  body larger than `max_body_bytes` (refused from Content-Length, before reading it), or
       inflating to more than that
  415  a Content-Encoding other than gzip, deflate or identity
  431  request line and headers over MAX_HEADER_BYTES or MAX_HEADERS fields (artifacts/serving/http_limits.py,
       answered there and the connection closed)
  500  the engine itself failed, or an output JSON-encoded holds NaN or Inf
  503  overloaded (queue full), not ready yet, stopped (shutting down), every connection busy
       at the connection limit, or the worker process running the request's batch died (not
       retried: artifacts/serving/workers.py)
  504  accepted but not answered within the bundle's timeout_s
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import socket
from typing import Any

import uvicorn

from temper.artifacts.core.errors import Overloaded, RequestError, RequestTimeout, Stopped
from temper.artifacts.formats.repository import LoadFailed, ModelNotServed
from temper.artifacts.serving.batcher import abandon
from temper.artifacts.serving.client_shm import ClientRegions
from temper.artifacts.serving.ensemble_runtime import Ensemble
from temper.artifacts.serving.exposition import Exposition
from temper.artifacts.serving.http_limits import (
    BODY_TIMEOUT_S,
    HEADER_TIMEOUT_S,
    KEEP_ALIVE_S,
    MIN_BODY_BYTES,
    Connections,
    GuardedProtocol,
    body_limit,
    connection_limit,
)
from temper.artifacts.serving.models import ControlDisabled, Loaded, Models
from temper.artifacts.serving.protocol import VERSION
from temper.artifacts.serving.repository_routes import REPOSITORY, RepositoryRoutes
from temper.artifacts.serving.rest_codec import (
    JSON_TYPE,
    HttpError,
    Response,
    RestCodec,
    encode_json,
    error_response,
    tensor_metadata,
)
from temper.artifacts.serving.runtime import Runtime
from temper.artifacts.serving.shm_http import PREFIXES, shm_route
from temper.artifacts.serving.triton_extensions import (
    EXTENSIONS,
    every_statistics,
    model_config,
    model_statistics,
    platform,
)

__all__ = ["InferenceServer", "bind", "body_limit", "serve"]

INLINE_BODY_BYTES = 64 * 1024  # larger bodies are decoded on the worker thread
INLINE_OUTPUT_ELEMENTS = 64 * 1024  # more output elements to write as JSON: encoded on the worker thread

log = logging.getLogger(__name__)


class InferenceServer:
    """ASGI app serving the models of a Models (a Runtime: a Models of that one); the lifespan loads the startup
    models (warm-up included) and stops them all.

    `max_body_bytes` None: the largest body_limit of the models. `max_connections` None: connection_limit().
    `regions`: the client shared memory regions, shared with a gRPC server (None: client shared memory off).
    """

    def __init__(self, models: Models | Runtime, max_body_bytes: int | None = None, max_connections: int | None = None,
                 header_timeout_s: float = HEADER_TIMEOUT_S, body_timeout_s: float = BODY_TIMEOUT_S,
                 keep_alive_s: float = KEEP_ALIVE_S, regions: ClientRegions | None = None) -> None:
        self.models = models if isinstance(models, Models) else Models.single(models)
        self.max_body_bytes = max_body_bytes or max([body_limit(c) for c in self.models.configs()], default=0) \
            or MIN_BODY_BYTES
        self.connections = Connections(max_connections or connection_limit(), header_timeout_s, body_timeout_s)
        self.keep_alive_s = keep_alive_s
        self.arriving = 0  # infer requests between their last body byte and the runtime; event loop only
        self.worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="temper-decode")
        self.owns_regions = regions is None  # closed at shutdown here; shared ones by whoever made them
        self.startup_error: Exception | None = None  # why the startup models did not load, for serve() to raise
        self.regions = regions if regions is not None else ClientRegions()
        self._views: dict[str, tuple[Loaded, RestCodec, bytes]] = {}  # per model loaded: its codec and metadata
        self.server_metadata = encode_json({"name": "temper", "version": VERSION,
                                            "extensions": EXTENSIONS})
        self.exposition = Exposition(self.models, self.connections)
        self.repository = RepositoryRoutes(self.models)

    @property
    def runtime(self) -> Runtime | Ensemble:
        """The Runtime of the one model served (a server of one bundle); AttributeError with several."""
        only = self.models.only()
        if only is None:
            raise AttributeError("this server serves several models; ask self.models")
        return only.runtime

    def _view(self, model: Loaded) -> tuple[RestCodec, bytes]:
        """The model's codec and metadata body, built once per load."""
        view = self._views.get(model.name)
        if view is None or view[0] is not model:
            config = model.runtime.config
            metadata = encode_json({
                "name": model.name, "versions": [model.version], "platform": platform(model.runtime),
                "inputs": tensor_metadata(config.inputs), "outputs": tensor_metadata(config.outputs),
            })
            view = self._views[model.name] = (model, RestCodec(config, self.max_body_bytes, self.regions,
                                                               model.version), metadata)
        return view[1], view[2]

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
            await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body})
        elif scope["type"] == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await asyncio.to_thread(self.models.start)
                except Exception as exc:  # noqa: BLE001 - any start-up failure: serve() raises it once uvicorn exits
                    self.startup_error = exc
                    await send({"type": "lifespan.startup.failed", "message": ""})  # logged by no one
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":  # runtime first: what is queued there gets 503, not 500
                await asyncio.to_thread(self.models.stop)
                self.worker.shutdown(wait=False, cancel_futures=True)
                if self.owns_regions:
                    self.regions.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _handle(self, scope: dict, receive: Any) -> Response:
        try:
            return await self._route(scope, receive)
        except HttpError as exc:
            return error_response(exc.status, str(exc))
        except RequestError as exc:
            return error_response(400, str(exc))
        except ModelNotServed as exc:
            return error_response(404, str(exc))
        except (Overloaded, Stopped, ControlDisabled) as exc:
            return error_response(503, str(exc))
        except LoadFailed as exc:
            return error_response(400, str(exc))
        except RequestTimeout as exc:
            return error_response(504, str(exc))
        except Exception as exc:
            log.exception("inference failed")
            return error_response(500, f"{type(exc).__name__}: {exc}")

    async def _route(self, scope: dict, receive: Any) -> Response:
        method, path = scope["method"], scope["path"]
        if path.startswith("/v2/models/"):
            name, _, action = path[len("/v2/models/"):].partition("/")
            if name == "stats" and not action and name not in self.models.catalog.names():  # every model's
                _allow(method, "GET")
                return 200, [JSON_TYPE], encode_json(every_statistics(self.models.all()))
            version = ""
            if action.startswith("versions/"):
                version, _, action = action[len("versions/"):].partition("/")
            if action == "ready":  # not an error for a model not loaded: it is not ready
                _allow(method, "GET")
                return self._model_ready(name, version)
            model = self.models.get(name, version)  # ModelNotServed: 404
            if action == "infer":
                _allow(method, "POST")
                return await self._infer(model, scope, receive)
            if action == "":
                _allow(method, "GET")
                return 200, [JSON_TYPE], self._view(model)[1]
            if action == "config":
                _allow(method, "GET")
                return 200, [JSON_TYPE], encode_json(model_config(model.runtime))
            if action == "stats":
                _allow(method, "GET")
                return 200, [JSON_TYPE], encode_json(model_statistics(model))
        elif path == "/v2/health/live":
            _allow(method, "GET")
            return (200, [], b"") if self.models.live else error_response(503, "every model is taken out")
        elif path == "/v2/health/ready":
            _allow(method, "GET")
            return (200, [], b"") if self.models.ready else error_response(503, "not every model asked for is ready")
        elif path.startswith(REPOSITORY):
            return await self.repository.route(method, path, await self._body(dict(scope["headers"]), receive))
        elif path.startswith(PREFIXES):
            return shm_route(self.regions, method, path, await self._body(dict(scope["headers"]), receive))
        elif path == "/metrics":
            _allow(method, "GET")
            body, content_type = self.exposition.render()
            return 200, [(b"content-type", content_type.encode())], body
        elif path in ("/v2", "/v2/"):
            _allow(method, "GET")
            return 200, [JSON_TYPE], self.server_metadata
        raise HttpError(404, f"no such endpoint: {method} {path}")

    def _model_ready(self, name: str, version: str) -> Response:
        model = self.models.get(name, version)  # an unknown model or version: 404, as before
        return (200, [], b"") if model.runtime.ready else error_response(503, f"model '{name}' is not ready")

    async def _infer(self, model: Loaded, scope: dict, receive: Any) -> Response:
        runtime, (codec, _) = model.runtime, self._view(model)
        timeout_s = runtime.config.timeout_s
        try:
            headers = dict(scope["headers"])
            body = await self._body(headers, receive)
            if len(body) > INLINE_BODY_BYTES or b"content-encoding" in headers:
                request_id, inputs, wanted, queue_s = await self._on_worker(codec.decode, body, headers)
            else:
                request_id, inputs, wanted, queue_s = codec.decode(body, headers)
            del body  # its JSON text is done with while the request waits (binary inputs are views that keep it)
            if not runtime.accepting:
                raise HttpError(503, f"model '{model.name}' is not ready")
        except (HttpError, RequestError):
            model.refused += 1  # never reached the runtime, which counts everything after this
            raise
        # RequestError, Overloaded, Stopped (unloaded meanwhile)
        future = runtime.submit(inputs, inline=await self._alone(runtime), timeout_s=queue_s)
        if future.done():  # ran inline: no hand-off back to the event loop to wait for
            results = future.result()
        else:
            try:  # wait_for cancels a still-queued future; abandon() fails a running one
                results = await asyncio.wait_for(asyncio.wrap_future(future), timeout_s)
            except TimeoutError:
                message = f"not answered within {timeout_s}s"
                if abandon(future, message):  # dropped if queued, a failure if running: never a success
                    raise RequestTimeout(message) from None
                results = future.result()
        try:
            extra = getattr(future, "temper_parameters", None)  # the burst fallback's: which model served it
            if sum(results[w.name].size for w in wanted if w.json) > INLINE_OUTPUT_ELEMENTS:
                return await self._on_worker(codec.encode, request_id, results, wanted, extra)
            return codec.encode(request_id, results, wanted, extra)
        except HttpError:
            model.refused += 1
            raise

    async def _on_worker(self, call: Any, *args: Any) -> Any:
        """Decode or encode on the worker pool; once shutdown has closed the pool, a late request is a 503."""
        try:
            future = asyncio.get_running_loop().run_in_executor(self.worker, call, *args)
        except RuntimeError:  # "cannot schedule new futures after shutdown"
            raise Stopped("the server is shutting down") from None
        return await future

    async def _alone(self, runtime: Runtime | Ensemble) -> bool:
        """Whether this request may run inline: the model is tiny and no other request reached
        this point in the same turn of the event loop.

        Requests that arrive together all get here before any of them resumes from the yield,
        so they see each other and go to the batcher to share a batch. Running them inline one
        by one would serialise every run on the event loop. Slow models never yield here.
        """
        if not runtime.inline:
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


def _allow(method: str, allowed: str) -> None:
    """HEAD is GET without the body (RFC 9110): load balancers and probes ask it."""
    if method != allowed and not (method == "HEAD" and allowed == "GET"):
        raise HttpError(405, f"method {method} not allowed here; use {allowed}")


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


def serve(models: Models | Runtime, sock: socket.socket, max_body_bytes: int | None = None,
          max_connections: int | None = None, regions: ClientRegions | None = None) -> None:
    """Serve on `sock` (from bind) until interrupted; the startup models warm up before requests are
    answered. uvicorn runs httptools and uvloop (measured 1.38x on a tiny model)."""
    app = InferenceServer(models, max_body_bytes, max_connections, regions=regions)
    quiet = _StartupFailedLine()  # the caller says why, in one line
    logging.getLogger("uvicorn.error").addFilter(quiet)
    try:
        uvicorn.Server(app.uvicorn_config()).run(sockets=[sock])
    except KeyboardInterrupt:  # uvicorn re-raises the Ctrl-C it shut down on; uvicorn.run() swallows it the same way
        pass
    except SystemExit:  # uvicorn's exit 3 when the start-up failed: the failure itself is raised below
        if app.startup_error is None:
            raise
    finally:
        logging.getLogger("uvicorn.error").removeFilter(quiet)
    if app.startup_error is not None:
        raise app.startup_error  # a model that cannot load (repository.LoadFailed), as Triton exits on one


class _StartupFailedLine(logging.Filter):
    """Drops uvicorn's "Application startup failed. Exiting.": serve() raises the failure instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != "Application startup failed. Exiting."
