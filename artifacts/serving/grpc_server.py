"""`temper serve --grpc-port`: the KServe v2 / Triton gRPC API (`inference.GRPCInferenceService`).

The messages and the servicer base class are the generated stubs tritonclient ships, so the wire
format is Triton's own and tritonclient.grpc and perf_analyzer talk to it unchanged. ModelConfig and
ModelStatistics answer the same documents as REST's `/config` and `/stats` (artifacts/serving/triton_extensions.py)
as protobuf; the repository RPCs index, load and unload the models as Triton does (serving/models.py). The system
shared-memory RPCs register, list and release artifacts/serving/client_shm.py's regions (shared with the REST
server); the CUDA ones list none and refuse to register any. ModelStreamInfer is artifacts/serving/grpc_stream.py's;
trace and log settings answer UNIMPLEMENTED from the base class.

Behind it are the same models as the REST server (artifacts/serving/models.py): per model one batcher, one bounded
queue, one set of metrics. It runs on gRPC's own thread pool, not on uvicorn's event loop (which server.py owns):
each in-flight RPC holds a pool thread that blocks on its Runtime future, so concurrent RPCs
reach the batcher together and share batches. The pool has threads for what the Runtimes can hold
queued and running and for the calls allowed to wait for their message (artifacts/serving/grpc_limits.py);
calls past that queue for a thread, as Triton's do, and the Runtime's queue refuses what it cannot hold.

Status codes, each with a one-line message; the server keeps serving afterwards:
  INVALID_ARGUMENT    bytes that are not the RPC's protobuf message; unknown, missing or repeated input;
                      wrong datatype; a shape the model does not take; data not matching its shape;
                      batch over max_batch_size; unknown output
  NOT_FOUND           unknown, unloaded or not yet loaded model, or a version it does not serve (ModelReady
                      answers ready: false instead, as Triton does)
  UNAVAILABLE         as Triton: queue full ("Exceeds maximum queue size"), not answered within the queue
                      timeout ("Request timeout expired"), not ready yet (warming up), or the Runtime
                      stopped (`temper serve` shutting down stops it before this server), or the worker
                      process running the request's batch died (not retried: artifacts/serving/workers.py), or the model
                      was unloaded while the request waited; load or unload in model control mode none
  RESOURCE_EXHAUSTED  message over the size limit (gRPC's own answer); a stream past ModelStreamInfer's bound
  CANCELLED           the request message did not arrive within the receive deadline, or before as many later
                      calls waited for theirs as the bound allows (artifacts/serving/grpc_limits.py); counted OTHER
  DEADLINE_EXCEEDED   the client's own deadline passed first
  PERMISSION_DENIED   a shared-memory RPC while client shared memory is off (`--allow-client-shm`)
  INTERNAL            the engine itself failed
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
from typing import Any, TypeAlias

import numpy as np
from google.protobuf import json_format

try:
    import grpc
    from tritonclient.grpc import model_config_pb2 as mc
    from tritonclient.grpc import service_pb2 as pb
    from tritonclient.grpc import service_pb2_grpc as pb_grpc
except (ImportError, RuntimeError) as exc:  # tritonclient reports a missing grpcio as a RuntimeError
    raise ImportError(f"gRPC serving needs grpcio and tritonclient[grpc] (pip install 'temper-ml[grpc]'): {exc}") \
        from exc

from temper.artifacts.core.errors import InstanceLost, Overloaded, RequestError, RequestTimeout, Stopped
from temper.artifacts.formats.bundle import TensorSpec
from temper.artifacts.formats.repository import ModelNotServed
from temper.artifacts.serving.client_shm import ClientRegions, ShmError, Target
from temper.artifacts.serving.counters import OTHER
from temper.artifacts.serving.grpc_limits import (
    IDLE_S,
    RECEIVE_TIMEOUT_S,
    ReceiveDeadline,
    Unparsable,
    most_waiting,
    options,
    pool_size,
)
from temper.artifacts.serving.grpc_stream import StreamInfer
from temper.artifacts.serving.models import Loaded, Models
from temper.artifacts.serving.protocol import DATATYPES, VERSION, WIRE
from temper.artifacts.serving.repository_rpcs import RepositoryRpcs
from temper.artifacts.serving.request_params import check_output, queue_timeout_s
from temper.artifacts.serving.runtime import Runtime
from temper.artifacts.serving.shm_grpc import SharedMemoryRpcs
from temper.artifacts.serving.triton_extensions import (
    EXTENSIONS,
    every_statistics,
    model_config,
    model_statistics,
    platform,
)

log = logging.getLogger(__name__)
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
SPARE_RPCS = 8  # RPCs admitted beyond what the Runtime holds, so that overload reads "queue full" as in Triton
Context: TypeAlias = grpc.ServicerContext
# KServe datatype -> the InferTensorContents field that carries it typed; FP16 only comes raw, as in Triton.
CONTENTS = {"FP32": "fp32_contents", "INT64": "int64_contents", "INT32": "int_contents", "INT8": "int_contents",
            "UINT8": "uint_contents", "BOOL": "bool_contents"}


class DeadlinePassed(RequestTimeout):
    """The client's deadline, shorter than the queue timeout, passed first (counted by the Runtime)."""


STATUS = {RequestError: grpc.StatusCode.INVALID_ARGUMENT, Overloaded: grpc.StatusCode.UNAVAILABLE,
          RequestTimeout: grpc.StatusCode.UNAVAILABLE, Stopped: grpc.StatusCode.UNAVAILABLE,  # Triton's codes
          InstanceLost: grpc.StatusCode.UNAVAILABLE,  # the worker running it died
          DeadlinePassed: grpc.StatusCode.DEADLINE_EXCEEDED}


class Refused(Exception):
    """A request turned away before it reached the Runtime, with the status code to answer."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class InferenceService(RepositoryRpcs, SharedMemoryRpcs, StreamInfer, pb_grpc.GRPCInferenceServiceServicer):
    """Health, metadata, configuration, statistics, the model repository, shared memory, ModelInfer and
    ModelStreamInfer for the models of a Models (a Runtime: a Models of that one)."""

    def __init__(self, models: Models | Runtime, regions: ClientRegions | None = None) -> None:
        self.models = models if isinstance(models, Models) else Models.single(models)
        self.regions = regions if regions is not None else ClientRegions()
        in_flight = self.models.capacity() + SPARE_RPCS
        self.limit_streams(max_streams=in_flight // 2, depth=in_flight)  # half the threads unary calls get
        self._failed = failure

    def ServerLive(self, request: pb.ServerLiveRequest, context: Context) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self.models.live)

    def ServerReady(self, request: pb.ServerReadyRequest, context: Context) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.models.ready)

    def ServerMetadata(self, request: pb.ServerMetadataRequest, context: Context) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(name="temper", version=VERSION, extensions=EXTENSIONS)

    def ModelReady(self, request: pb.ModelReadyRequest, context: Context) -> pb.ModelReadyResponse:
        """Ready or not, never an error: an unknown model or version is not ready, as Triton answers."""
        try:
            return pb.ModelReadyResponse(ready=self.models.get(request.name, request.version).runtime.ready)
        except ModelNotServed:
            return pb.ModelReadyResponse(ready=False)

    def ModelMetadata(self, request: pb.ModelMetadataRequest, context: Context) -> pb.ModelMetadataResponse:
        model = self._model_or_abort(request.name, request.version, context)
        config = model.runtime.config
        return pb.ModelMetadataResponse(name=model.name, versions=[model.version], platform=platform(model.runtime),
                                        inputs=_tensors(config.inputs), outputs=_tensors(config.outputs))

    def ModelConfig(self, request: pb.ModelConfigRequest, context: Context) -> pb.ModelConfigResponse:
        model = self._model_or_abort(request.name, request.version, context)
        return pb.ModelConfigResponse(config=json_format.ParseDict(model_config(model.runtime), mc.ModelConfig()))

    def ModelStatistics(self, request: pb.ModelStatisticsRequest, context: Context) -> pb.ModelStatisticsResponse:
        """This model's statistics; an empty name asks for every model's."""
        if request.name:
            stats = model_statistics(self._model_or_abort(request.name, request.version, context))
        else:
            stats = every_statistics(self.models.all())
        return json_format.ParseDict(stats, pb.ModelStatisticsResponse())

    def ModelInfer(self, request: pb.ModelInferRequest, context: Context) -> pb.ModelInferResponse:
        """Decode, run through the model's batcher, answer with raw_output_contents."""
        model = self._model_or_abort(request.model_name, request.model_version, context)
        try:
            future, wanted = self._start(model, request, inline=True)  # a pool thread may run a tiny model
            return self._answer(model, request, future, wanted, context.time_remaining())
        except Exception as exc:
            context.abort(*failure(model, exc))

    def refused(self) -> None:
        """Count an inference request turned away before any model read its name (it did not parse, or its message
        came late): against the one model served; with several, no model can be named, so none counts it."""
        only = self.models.only()
        if only is not None:
            only.runtime.metrics.record_failure(OTHER)

    def late(self, rpc: str) -> None:
        """An RPC cancelled at the receive deadline: a ModelInfer among them is a failed inference request."""
        if rpc == "ModelInfer":
            self.refused()

    def _model_or_abort(self, name: str, version: str, context: Context) -> Loaded:
        try:
            return self.models.get(name, version)
        except ModelNotServed as exc:
            context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
            raise  # abort raises; this line is for the type checker

    def _start(self, model: Loaded, request: pb.ModelInferRequest,
               inline: bool) -> tuple[concurrent.futures.Future, list[tuple[str, Target | None]]]:
        """Decode and queue a request on the model's batcher: its future and the outputs to answer with."""
        runtime = model.runtime
        try:
            queue_s = queue_timeout_s(_params(request.parameters), runtime.config.timeout_s)
        except RequestError as exc:
            raise _invalid(str(exc)) from None
        inputs = self._decode_inputs(model, request)
        wanted = self._wanted_outputs(model, request)
        if not runtime.accepting:
            raise Refused(grpc.StatusCode.UNAVAILABLE, f"model '{model.name}' is not ready")
        return runtime.submit(inputs, inline=inline, timeout_s=queue_s), wanted

    def _answer(self, model: Loaded, request: pb.ModelInferRequest, future: concurrent.futures.Future,
                wanted: list[tuple[str, Target | None]], client_remaining_s: float | None) -> pb.ModelInferResponse:
        """Wait for a queued request's outputs (abandoning it at the timeout) and build its response."""
        runtime = model.runtime
        timeout_s = runtime.config.timeout_s
        if client_remaining_s is not None and client_remaining_s < timeout_s:  # the client gives up first
            try:
                results = runtime.result(future, client_remaining_s)
            except RequestTimeout as exc:
                raise DeadlinePassed(f"the client's deadline passed: {exc}") from None
        else:
            results = runtime.result(future, timeout_s)
        response = pb.ModelInferResponse(model_name=model.name, model_version=model.version, id=request.id)
        for key, value in (getattr(future, "temper_parameters", None) or {}).items():  # the burst fallback's
            response.parameters[key].string_param = value  # which model served it and why, as REST answers
        for name, target in wanted:
            array = results[name]
            response.outputs.add(name=name, datatype=DATATYPES[array.dtype.name], shape=array.shape)
            if target is None:
                little = np.ascontiguousarray(array, array.dtype.newbyteorder("<"))
                response.raw_output_contents.append(little.tobytes())
                continue
            try:
                self.regions.write(f"output '{name}'", target, array)
            except ShmError as exc:  # unregistered meanwhile, or the output is larger than the space given
                raise _invalid(str(exc)) from None
            response.raw_output_contents.append(b"")  # as Triton: one entry per output keeps them in order
        return response

    def _decode_inputs(self, model: Loaded, request: pb.ModelInferRequest) -> dict[str, np.ndarray]:
        """Arrays from shared memory regions, raw_input_contents (one per other input, in order) or each
        input's typed contents.

        Missing inputs and shapes the model does not take are left to the Runtime's own checks."""
        raw = request.raw_input_contents
        try:
            targets = [self.regions.target(f"input '{t.name}'", _params(t.parameters)) for t in request.inputs]
        except ShmError as exc:
            raise _invalid(str(exc)) from None
        in_body = sum(target is None for target in targets)
        if raw and len(raw) != in_body:
            raise _invalid(f"{len(raw)} raw_input_contents for {in_body} inputs; one per input not in shared "
                           "memory, in order")
        inputs: dict[str, np.ndarray] = {}
        index = 0
        for tensor, target in zip(request.inputs, targets, strict=True):
            name = tensor.name
            spec = model.inputs.get(name)
            if spec is None:
                raise _invalid(f"unknown input '{name}'; the model takes {', '.join(model.inputs)}")
            if name in inputs:
                raise _invalid(f"input '{name}' is given twice")
            datatype = DATATYPES[spec.dtype]
            if tensor.datatype != datatype:
                raise _invalid(f"input '{name}': datatype '{tensor.datatype}' does not match the model's {datatype}")
            shape = list(tensor.shape)
            if any(d < 0 for d in shape):
                raise _invalid(f"input '{name}': shape must be non-negative integers, got {shape}")
            dtype, count = WIRE[datatype], math.prod(shape)
            if target is not None:
                if tensor.HasField("contents"):
                    raise _invalid(f"input '{name}' names a shared memory region and also has contents; "
                                   "send one or the other")
                try:
                    config = model.runtime.config  # the shape against the model before a byte of the region is read
                    config.check_shape(name, shape, model.runtime.max_rows)
                    array = self.regions.read(f"input '{name}'", target, dtype, count)
                except RequestError as exc:  # ShmError among them
                    raise _invalid(str(exc)) from None
            elif raw:
                if tensor.HasField("contents"):
                    raise _invalid(f"input '{name}' has contents although the request uses raw_input_contents")
                if len(raw[index]) != count * dtype.itemsize:
                    raise _invalid(f"input '{name}': {len(raw[index])} raw bytes for shape {shape} of {datatype} "
                                   f"({count * dtype.itemsize} bytes)")
                array = np.frombuffer(raw[index], dtype=dtype)
                index += 1
            else:
                field = CONTENTS.get(datatype)
                if field is None:
                    raise _invalid(f"input '{name}': {datatype} data must come in raw_input_contents")
                values = getattr(tensor.contents, field)
                if len(values) != count:
                    raise _invalid(f"input '{name}': {len(values)} {field} values for shape {shape} ({count} elements)")
                try:
                    array = np.array(values, dtype=dtype)
                except (OverflowError, ValueError) as exc:
                    raise _invalid(f"input '{name}': {field} values are not {datatype}: {exc}") from None
            inputs[name] = array.reshape(shape)
        return inputs

    def _wanted_outputs(self, model: Loaded, request: pb.ModelInferRequest) -> list[tuple[str, Target | None]]:
        """The outputs to answer with, in the order asked (all of them when none is asked for), each
        with the shared memory it goes to (checked now: a request that cannot be answered is not run)."""
        if not request.outputs:
            return [(name, None) for name in model.outputs]
        wanted = []
        for output in request.outputs:
            if output.name not in model.outputs:
                raise _invalid(f"unknown output '{output.name}'; the model gives {', '.join(model.outputs)}")
            params = _params(output.parameters)
            where = f"output '{output.name}'"
            try:
                check_output(output.name, params)
                target = self.regions.target(where, params)
                if target is not None:
                    self.regions.check(where, target)
            except RequestError as exc:
                raise _invalid(str(exc)) from None
            wanted.append((output.name, target))
        return wanted


class GrpcServer:
    """A gRPC server for a Models (or one Runtime) on its own thread pool; start() binds, stop() drains.

    It neither loads nor stops the models: `temper serve` shares them with the REST server, whose
    lifespan loads and warms them up; until then ModelInfer answers NOT_FOUND for a model not loaded yet, and
    UNAVAILABLE for one warming up.
    """

    def __init__(self, models: Models | Runtime, host: str = "127.0.0.1", port: int = 8001,
                 max_message_bytes: int = MAX_MESSAGE_BYTES, regions: ClientRegions | None = None,
                 receive_timeout_s: float = RECEIVE_TIMEOUT_S, idle_s: float = IDLE_S) -> None:
        self.address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        service = InferenceService(models, regions)
        # what the models can hold queued and running, and SPARE more that they answer at once (queue full)
        in_flight = service.models.capacity() + SPARE_RPCS
        # outermost first: the receive deadline holds the call until its message came, then Unparsable parses it
        self.receiving = ReceiveDeadline(service.late, receive_timeout_s, most_waiting(in_flight))
        self.server = grpc.server(  # no maximum_concurrent_rpcs: calls past the threads queue (grpc_limits.py)
            concurrent.futures.ThreadPoolExecutor(pool_size(in_flight), thread_name_prefix="temper-grpc"),
            interceptors=[self.receiving, Unparsable(service.refused)],
            options=[("grpc.max_receive_message_length", max_message_bytes),
                     ("grpc.so_reuseport", 0),  # a port in use fails here instead of being shared
                     *options(in_flight, idle_s)],  # artifacts/serving/grpc_limits.py
        )
        pb_grpc.add_GRPCInferenceServiceServicer_to_server(service, self.server)

    def start(self) -> int:
        """Bind and serve in the background; the bound port (useful with port 0). OSError when it cannot bind."""
        try:
            port = self.server.add_insecure_port(self.address)
        except RuntimeError as exc:  # grpcio raises, or returns 0 in older versions
            raise OSError(f"cannot listen for gRPC on {self.address}: {exc}") from None
        if port == 0:
            raise OSError(f"cannot listen for gRPC on {self.address} (address in use?)")
        self.server.start()
        return port

    def stop(self, grace_s: float = 5.0) -> None:
        """Refuse new RPCs and give those in flight grace_s to finish."""
        self.server.stop(grace_s).wait()
        self.receiving.stop()


def failure(model: Loaded, exc: Exception) -> tuple[grpc.StatusCode, str]:
    """The status code and message answering a failed inference request; a refusal the Runtime did not see is
    counted here."""
    if isinstance(exc, Refused):
        model.runtime.metrics.record_failure(OTHER)
        return exc.code, str(exc)
    if isinstance(exc, (RequestError, Overloaded, RequestTimeout, Stopped)):  # already counted by the Runtime
        return STATUS[type(exc)], str(exc)
    log.exception("inference failed", exc_info=exc)
    return grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}"


def _params(parameters: Any) -> dict[str, object]:
    """A protobuf map of InferParameter as plain values, for request_params."""
    return {key: getattr(value, value.WhichOneof("parameter_choice") or "int64_param")
            for key, value in parameters.items()}


def _invalid(message: str) -> Refused:
    return Refused(grpc.StatusCode.INVALID_ARGUMENT, message)


def _tensors(specs: list[TensorSpec]) -> list[pb.ModelMetadataResponse.TensorMetadata]:
    metadata = pb.ModelMetadataResponse.TensorMetadata
    return [metadata(name=s.name, datatype=DATATYPES[s.dtype], shape=s.shape) for s in specs]
