"""Triton's ModelStreamInfer: a bidirectional stream of ModelInferRequests, each answered on the stream.

What `perf_analyzer -i grpc --streaming` and tritonclient.grpc's start_stream/async_stream_infer use. Each request
takes ModelInfer's path (decoded, checked, queued on the model's batcher, so a stream's requests batch with each
other and with every other client's) and its answer is a ModelStreamInferResponse; a request that fails answers
`error_message` (with the request's id in `infer_response`) and the stream goes on, as Triton's does. Answers come
in the order the requests came.

Limits, so that streams cannot take what unary calls need: one stream holds a pool thread for its life, so at
most `max_streams` are open at once (past that, RESOURCE_EXHAUSTED); a stream holds at most `depth` requests
queued or waiting to be answered, after which it reads no more (HTTP/2 flow control then holds the client back).
A message that does not parse ends the stream with grpcio's own status (INTERNAL), not one error_message:
Triton ends it too (a failed read is the end of the client's side), with OK.
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import grpc
from tritonclient.grpc import service_pb2 as pb

from temper.artifacts.formats.repository import ModelNotServed

if TYPE_CHECKING:
    from temper.artifacts.serving.client_shm import Target
    from temper.artifacts.serving.models import Loaded

log = logging.getLogger(__name__)

PUT_TICK_S = 0.1  # how often a reader held back by a full stream checks that the stream is still open
# one request of a stream: (request, its model, its future and outputs) when queued, else (request, None, error)
Queued = tuple[concurrent.futures.Future, list[tuple[str, "Target | None"]]]
Started = tuple[pb.ModelInferRequest, "Loaded | None", "Queued | str"]


class StreamInfer:
    """ModelStreamInfer for InferenceService (grpc_server.py), whose _start, _answer and models it uses."""

    models: Any
    _start: Any
    _answer: Any
    _failed: Any  # (model, exception) -> (status code, message), counting what the Runtime did not

    def limit_streams(self, max_streams: int, depth: int) -> None:
        self.max_streams, self.depth = max(1, max_streams), max(1, depth)
        self._streams = threading.BoundedSemaphore(self.max_streams)

    def ModelStreamInfer(self, requests: Iterator[pb.ModelInferRequest],
                         context: grpc.ServicerContext) -> Iterator[pb.ModelStreamInferResponse]:
        if not self._streams.acquire(blocking=False):
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"{self.max_streams} ModelStreamInfer streams are open already; close one or use ModelInfer")
        try:
            started: queue.Queue[Started | None] = queue.Queue(self.depth)
            reader = threading.Thread(target=self._read, args=(requests, started, context), daemon=True,
                                      name="temper-grpc-stream")
            reader.start()
            while True:
                try:
                    item = started.get(timeout=PUT_TICK_S)
                except queue.Empty:
                    if context.is_active():
                        continue
                    return  # the client went away: nothing more to answer
                if item is None:
                    return
                yield self._respond(item, context)
        finally:
            self._streams.release()

    def _read(self, requests: Iterator[pb.ModelInferRequest], started: queue.Queue[Started | None],
              context: grpc.ServicerContext) -> None:
        """Queue each request as it comes; None once the client closed its side (or the stream ended)."""
        try:
            for request in requests:
                if not _put(started, self._begin(request), context):
                    return
        except grpc.RpcError:  # the client cancelled, or grpcio could not parse a message
            pass
        except Exception as exc:  # noqa: BLE001 - what grpcio raises on a stream already torn down
            log.debug("stream closed while reading: %s", exc)
        _put(started, None, context)

    def _begin(self, request: pb.ModelInferRequest) -> Started:
        try:
            model = self.models.get(request.model_name, request.model_version)
        except ModelNotServed as exc:
            return request, None, str(exc)
        try:
            return request, model, self._start(model, request, inline=False)  # a stream's requests batch together
        except Exception as exc:
            return request, model, self._failed(model, exc)[1]

    def _respond(self, item: Started, context: grpc.ServicerContext) -> pb.ModelStreamInferResponse:
        request, model, begun = item
        if model is not None and not isinstance(begun, str):
            try:
                return pb.ModelStreamInferResponse(infer_response=self._answer(model, request, *begun,
                                                                               context.time_remaining()))
            except Exception as exc:
                begun = self._failed(model, exc)[1]
        return pb.ModelStreamInferResponse(error_message=str(begun), infer_response=pb.ModelInferResponse(
            model_name=request.model_name, model_version=request.model_version, id=request.id))


def _put(started: queue.Queue[Started | None], item: Started | None, context: grpc.ServicerContext) -> bool:
    """Hand `item` to the answering side, waiting while the stream is full; False once the stream has ended."""
    while context.is_active():
        try:
            started.put(item, timeout=PUT_TICK_S)
            return True
        except queue.Full:
            continue
    if isinstance(item, tuple) and item[1] is not None and not isinstance(item[2], str):
        item[2][0].cancel()  # queued and nobody will read its answer: dropped if it has not run yet
    return False
