"""The REST routes of Triton's model repository extension, over artifacts/serving/models.py's Models:

  POST /v2/repository/index               body {"ready": bool} optional; 200 [{name, version, state, reason}, ...]
  POST /v2/repository/models/NAME/load    200, empty body, once the model is loaded and warmed up
  POST /v2/repository/models/NAME/unload  200, empty body, once it is stopped

Errors answer {"error": "<one line>"} with Triton's codes: 503 load or unload in model control mode none,
400 a model the repository does not hold or that failed to load, a body that is not the JSON asked for, or
load parameters (a config override, model files: not supported).
A load runs on a thread of its own, so the event loop keeps answering the other models meanwhile.
"""

from __future__ import annotations

import asyncio

import orjson

from temper.artifacts.serving.models import Models
from temper.artifacts.serving.rest_codec import JSON_TYPE, HttpError, Response, encode_json

REPOSITORY = "/v2/repository/"


class RepositoryRoutes:
    def __init__(self, models: Models) -> None:
        self.models = models

    async def route(self, method: str, path: str, body: bytes | bytearray) -> Response:
        """Answer one request whose path starts with REPOSITORY (ControlDisabled, LoadFailed: the server maps them)."""
        rest = path[len(REPOSITORY):]
        if method != "POST":
            raise HttpError(405, f"method {method} not allowed here; use POST")
        if rest == "index":
            ready = _json(body, "index").get("ready", False)
            if not isinstance(ready, bool):
                raise HttpError(400, "Invalid value for 'ready': expected a boolean")
            return 200, [JSON_TYPE], encode_json(self.models.index(ready_only=ready))
        name, _, action = rest.removeprefix("models/").partition("/") if rest.startswith("models/") else ("", "", "")
        if not name or action not in ("load", "unload"):
            raise HttpError(404, f"no such endpoint: {method} {path}")
        if _json(body, action).get("parameters") and action == "load":
            raise HttpError(400, "load parameters (Triton's config override, model files) are not supported: "
                                 "temper serves the bundle in the repository's newest version folder as it is")
        if action == "load":
            await asyncio.to_thread(self.models.load, name)
        else:
            await asyncio.to_thread(self.models.unload, name)
        return 200, [], b""


def _json(body: bytes | bytearray, what: str) -> dict:
    if not body:
        return {}
    try:
        request = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise HttpError(400, f"the {what} request is not JSON: {exc}") from None
    if not isinstance(request, dict):
        raise HttpError(400, f"the {what} request must be a JSON object")
    return request
