"""The REST routes of Triton's shared-memory extensions, over artifacts/serving/client_shm.py's regions:

  GET  /v2/systemsharedmemory[/region/NAME]/status      200 [{name, key, offset, byte_size}, ...]
  POST /v2/systemsharedmemory/region/NAME/register      body {key, offset, byte_size}; 200, empty body
  POST /v2/systemsharedmemory[/region/NAME]/unregister  200, empty body (every region without NAME)

and the CUDA ones (/v2/cudasharedmemory/...), which list no regions and refuse to register any.
Errors answer {"error": "<one line>"}: 400 a bad request, 404 status of a region not registered,
403 while client shared memory is off (`temper serve --allow-client-shm` turns it on).
"""

from __future__ import annotations

import orjson

from temper.artifacts.serving.client_shm import NO_CUDA, ClientRegions, ShmError
from temper.artifacts.serving.rest_codec import JSON_TYPE, HttpError, Response, encode_json, error_response

PREFIXES = ("/v2/systemsharedmemory", "/v2/cudasharedmemory")
STATUS = {"invalid": 400, "not_found": 404, "forbidden": 403}


def shm_route(regions: ClientRegions, method: str, path: str, body: bytes | bytearray) -> Response:
    """Answer one request whose path starts with one of PREFIXES."""
    cuda = path.startswith("/v2/cudasharedmemory")
    rest = path[len(PREFIXES[1] if cuda else PREFIXES[0]):]
    name = ""
    if rest.startswith("/region/"):
        name, _, action = rest[len("/region/"):].partition("/")
        rest = "/" + action
    if rest not in ("/status", "/register", "/unregister") or (rest == "/register" and not name):
        raise HttpError(404, f"no such endpoint: {method} {path}")
    wanted = "GET" if rest == "/status" else "POST"
    if method != wanted:
        raise HttpError(405, f"method {method} not allowed here; use {wanted}")
    try:
        if cuda:  # nothing is ever registered there, so listing and unregistering are truthful no-ops
            if rest == "/register":
                raise ShmError(NO_CUDA)
            if name and rest == "/status":
                raise ShmError(f"no CUDA shared memory region '{name}' is registered", "not_found")
            return 200, [JSON_TYPE], b"[]" if rest == "/status" else b""
        if rest == "/status":
            return 200, [JSON_TYPE], encode_json(regions.status(name))
        if rest == "/unregister":
            regions.unregister(name)
            return 200, [], b""
        request = _json(body)
        regions.register(name, request.get("key"), request.get("offset", 0), request.get("byte_size"))
        return 200, [], b""
    except ShmError as exc:
        return error_response(STATUS[exc.kind], str(exc))


def _json(body: bytes | bytearray) -> dict:
    try:
        request = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ShmError(f"the register request is not JSON: {exc}") from None
    if not isinstance(request, dict):
        raise ShmError('the register request must be a JSON object {"key", "offset", "byte_size"}')
    return request
