"""The gRPC side of Triton's shared-memory extensions, over artifacts/serving/client_shm.py's regions (shared
with the REST server): SystemSharedMemoryStatus, Register and Unregister, and the CUDA ones, which
list no regions and refuse to register any. A mixin of artifacts/serving/grpc_server.py's servicer.

Codes: INVALID_ARGUMENT a bad request, NOT_FOUND status of a region not registered, PERMISSION_DENIED
while client shared memory is off (`temper serve --allow-client-shm` turns it on).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeAlias

import grpc
from tritonclient.grpc import service_pb2 as pb

from temper.artifacts.serving.client_shm import NO_CUDA, ClientRegions, ShmError

SHM_STATUS = {"invalid": grpc.StatusCode.INVALID_ARGUMENT, "not_found": grpc.StatusCode.NOT_FOUND,
              "forbidden": grpc.StatusCode.PERMISSION_DENIED}
Context: TypeAlias = grpc.ServicerContext


class SharedMemoryRpcs:
    """The shared-memory RPCs of GRPCInferenceService, for a servicer that sets `regions`."""

    regions: ClientRegions

    def SystemSharedMemoryStatus(self, request: pb.SystemSharedMemoryStatusRequest,
                                 context: Context) -> pb.SystemSharedMemoryStatusResponse:
        regions = self._shm(context, self.regions.status, request.name)
        status = pb.SystemSharedMemoryStatusResponse.RegionStatus
        return pb.SystemSharedMemoryStatusResponse(regions={r["name"]: status(**r) for r in regions})

    def SystemSharedMemoryRegister(self, request: pb.SystemSharedMemoryRegisterRequest,
                                   context: Context) -> pb.SystemSharedMemoryRegisterResponse:
        self._shm(context, self.regions.register, request.name, request.key, request.offset, request.byte_size)
        return pb.SystemSharedMemoryRegisterResponse()

    def SystemSharedMemoryUnregister(self, request: pb.SystemSharedMemoryUnregisterRequest,
                                     context: Context) -> pb.SystemSharedMemoryUnregisterResponse:
        self._shm(context, self.regions.unregister, request.name)
        return pb.SystemSharedMemoryUnregisterResponse()

    def CudaSharedMemoryStatus(self, request: pb.CudaSharedMemoryStatusRequest,
                               context: Context) -> pb.CudaSharedMemoryStatusResponse:
        """No CUDA region is ever registered: none to list (perf_analyzer asks, and unregisters all)."""
        if request.name:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no CUDA shared memory region '{request.name}' is registered")
        return pb.CudaSharedMemoryStatusResponse()

    def CudaSharedMemoryRegister(self, request: pb.CudaSharedMemoryRegisterRequest,
                                 context: Context) -> pb.CudaSharedMemoryRegisterResponse:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, NO_CUDA)

    def CudaSharedMemoryUnregister(self, request: pb.CudaSharedMemoryUnregisterRequest,
                                   context: Context) -> pb.CudaSharedMemoryUnregisterResponse:
        return pb.CudaSharedMemoryUnregisterResponse()

    def _shm(self, context: Context, call: Callable[..., Any], *args: Any) -> Any:
        try:
            return call(*args)
        except ShmError as exc:
            context.abort(SHM_STATUS[exc.kind], str(exc))
