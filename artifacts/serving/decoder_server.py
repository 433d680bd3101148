"""`temper serve` on a decoder LLM: Triton's generate extension over REST, with the health, metadata and
/metrics endpoints of the tensor server.

A small ASGI app of its own rather than another kind of model in server.py's: a decoder answers text, not
tensors (no KServe v2 infer, no batcher, no worker processes), and its request is a stream of tokens that holds an
instance for seconds. Routes:
  POST /v2/models/NAME[/versions/V]/generate         {"text_input", "parameters": {"max_tokens"}} ->
                                                       {"model_name", "model_version", "text_output"}
  POST /v2/models/NAME[/versions/V]/generate_stream  the same request; Server-Sent Events, one `data: {...}` per
                                                       piece of new text (text_output), an error as `data: {"error"}`
  GET  /v2/health/live, /v2/health/ready, /v2, /v2/models/NAME[/versions/V][/ready], /metrics
Status codes, each with a body {"error": "<one line>"}: 400 a bad request (not JSON, no text_input, max_tokens not
a positive integer, prompt plus max_tokens over the context), 404 unknown model, version or path, 405 wrong method,
413 a body over MAX_BODY_BYTES, 500 the engine failed, 503 the queue full, not ready, or shutting down.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from typing import Any

import uvicorn
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest

from temper.artifacts.core.errors import Overloaded, RequestError, Stopped
from temper.artifacts.serving.decoder_runtime import DecoderModel, Request
from temper.artifacts.serving.protocol import VERSION

MAX_BODY_BYTES = 1024 * 1024
JSON = (b"content-type", b"application/json")
EVENTS = (b"content-type", b"text/event-stream; charset=utf-8")

log = logging.getLogger(__name__)


class HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _json(value: object) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def _line(message: str) -> str:
    return " ".join(message.split())  # one line, whatever the exception said


class GenerateServer:
    """ASGI app serving one DecoderModel; the lifespan warms it up before /v2/health/ready answers 200."""

    def __init__(self, model: DecoderModel) -> None:
        self.model = model
        self.startup_error: Exception | None = None
        self.metadata = _json({"name": model.name, "versions": [model.version], "platform": model.platform,
                               "inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1]},
                                          {"name": "max_tokens", "datatype": "INT32", "shape": [1]}],
                               "outputs": [{"name": "text_output", "datatype": "BYTES", "shape": [1]}]})
        self.server_metadata = _json({"name": "temper", "version": VERSION, "extensions": ["generate"]})

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            try:
                await self._route(scope, receive, send)
            except HttpError as exc:
                await _answer(send, exc.status, _json({"error": _line(str(exc))}), JSON)

    async def _lifespan(self, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await asyncio.to_thread(self.model.warm_up)
                except Exception as exc:  # noqa: BLE001 - serve() raises it once uvicorn exits
                    self.startup_error = exc
                    await send({"type": "lifespan.startup.failed", "message": ""})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                self.model.stop()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _route(self, scope: dict, receive: Any, send: Any) -> None:
        method, path = scope["method"], scope["path"]
        model = self.model
        if path.startswith("/v2/models/"):
            name, _, action = path[len("/v2/models/"):].partition("/")
            version = ""
            if action.startswith("versions/"):
                version, _, action = action[len("versions/"):].partition("/")
            if name != model.name:
                raise HttpError(404, f"unknown model '{name}'")
            if version and version != model.version:
                raise HttpError(404, f"model '{name}' has no version '{version}'; it serves version {model.version}")
            if action in ("generate", "generate_stream"):
                _allow(method, "POST")
                await self._generate(scope, receive, send, stream=action == "generate_stream")
                return
            if action == "ready":
                _allow(method, "GET")
                ready = model.ready and not model.stopped
                await _answer(send, 200 if ready else 503, b"" if ready else _json(
                    {"error": f"model '{name}' is not ready"}), JSON, scope)
                return
            if action == "":
                _allow(method, "GET")
                await _answer(send, 200, self.metadata, JSON, scope)
                return
        elif path in ("/v2/health/live", "/v2/health/ready"):
            _allow(method, "GET")
            ready = path.endswith("live") or (model.ready and not model.stopped)
            await _answer(send, 200 if ready else 503, b"" if ready else _json({"error": "not ready"}), JSON, scope)
            return
        elif path in ("/v2", "/v2/"):
            _allow(method, "GET")
            await _answer(send, 200, self.server_metadata, JSON, scope)
            return
        elif path == "/metrics":
            _allow(method, "GET")
            await _answer(send, 200, generate_latest(model.metrics.registry),
                          (b"content-type", CONTENT_TYPE_PLAIN_0_0_4.encode()), scope)
            return
        raise HttpError(404, f"no such endpoint: {method} {path}")

    async def _generate(self, scope: dict, receive: Any, send: Any, stream: bool) -> None:
        model = self.model
        try:
            body = await _body(receive)
            try:
                parsed = json.loads(body)
            except (UnicodeDecodeError, ValueError) as exc:
                raise RequestError(f"the body is not JSON: {exc}") from None
            request = model.request(parsed)
        except (HttpError, RequestError) as exc:
            model.count("bad_request")
            raise HttpError(getattr(exc, "status", 400), str(exc)) from None
        if not model.ready:
            raise HttpError(503, f"model '{model.name}' is not ready")
        gone = asyncio.Event()  # the client disconnected: its generation stops at the next token
        watcher = asyncio.create_task(_watch(receive, request, gone))
        try:
            if stream:
                await self._stream(request, send, gone)
                return
            pieces: list[str] = []
            try:
                async for piece in model.stream(request):
                    pieces.append(piece)
            except (Overloaded, Stopped) as exc:
                raise HttpError(503, str(exc)) from None
            except Exception as exc:
                log.exception("generation failed")
                model.count("failure")
                raise HttpError(500, f"{type(exc).__name__}: {exc}") from None
        finally:
            watcher.cancel()
        if gone.is_set():
            model.count("cancelled")
            return
        model.count("success")
        await _answer(send, 200, _json({"model_name": model.name, "model_version": model.version,
                                        "text_output": "".join(pieces)}), JSON)

    async def _stream(self, request: Request, send: Any, gone: asyncio.Event) -> None:
        """Server-Sent Events: the status is sent with the first event, so an admission failure is still a 503
        and a failure after it an error event."""
        model, started = self.model, False
        head = {"model_name": model.name, "model_version": model.version}
        generation = model.stream(request)
        try:
            async for piece in generation:
                if not started:
                    await send({"type": "http.response.start", "status": 200,
                                "headers": [EVENTS, (b"cache-control", b"no-cache")]})
                    started = True
                await send({"type": "http.response.body", "body": b"data: " + _json({**head, "text_output": piece})
                            + b"\n\n", "more_body": True})
        except (Overloaded, Stopped) as exc:
            if not started:
                raise HttpError(503, str(exc)) from None
            await _event_error(send, str(exc))
            return
        except OSError:  # a server that raises on a send to a closed connection: as a disconnect
            request.cancelled.set()
            gone.set()
            await generation.aclose()
        except Exception as exc:
            log.exception("generation failed")
            model.count("failure")
            if not started:
                raise HttpError(500, f"{type(exc).__name__}: {exc}") from None
            await _event_error(send, f"{type(exc).__name__}: {exc}")
            return
        if gone.is_set():
            model.count("cancelled")
            return
        model.count("success")
        if not started:  # no text at all (an end-of-sequence first): one event with the empty text
            await send({"type": "http.response.start", "status": 200, "headers": [EVENTS]})
            await send({"type": "http.response.body", "body": b"data: " + _json({**head, "text_output": ""})
                        + b"\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b""})


async def _watch(receive: Any, request: Request, gone: asyncio.Event) -> None:
    """Wait for the client to disconnect (the body was read whole: nothing else arrives) and stop its generation,
    which would otherwise run to max_tokens for no one."""
    while (await receive())["type"] != "http.disconnect":
        pass
    gone.set()
    request.cancelled.set()


async def _event_error(send: Any, message: str) -> None:
    await send({"type": "http.response.body", "body": b"data: " + _json({"error": _line(message)}) + b"\n\n"})


async def _answer(send: Any, status: int, body: bytes, content_type: tuple[bytes, bytes],
                  scope: dict | None = None) -> None:
    headers = [content_type, (b"content-length", str(len(body)).encode())] if body else \
        [(b"content-length", b"0")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": b"" if scope and scope["method"] == "HEAD" else body})


async def _body(receive: Any) -> bytes:
    body = b""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise HttpError(400, "the client disconnected before sending the whole body")
        body += message.get("body", b"")
        if len(body) > MAX_BODY_BYTES:
            raise HttpError(413, f"request body is over the limit of {MAX_BODY_BYTES:,} bytes")
        if not message.get("more_body", False):
            return body


def _allow(method: str, allowed: str) -> None:
    if method != allowed and not (method == "HEAD" and allowed == "GET"):
        raise HttpError(405, f"method {method} not allowed here; use {allowed}")


def serve(model: DecoderModel, sock: socket.socket) -> None:
    """Serve on `sock` (bound by server.bind) until interrupted; the model warms up before it says ready."""
    app = GenerateServer(model)
    config = uvicorn.Config(app, lifespan="on", access_log=False, log_level="warning", server_header=False,
                            date_header=False)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    except SystemExit:
        if app.startup_error is None:
            raise
    if app.startup_error is not None:
        raise app.startup_error
