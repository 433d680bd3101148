"""The gRPC side of Triton's model repository extension, over artifacts/serving/models.py's Models: RepositoryIndex,
RepositoryModelLoad and RepositoryModelUnload. A mixin of artifacts/serving/grpc_server.py's servicer.

A load runs on the RPC's own thread and answers once the model is loaded and warmed up, as Triton's does.
Codes as Triton's: UNAVAILABLE for load or unload in model control mode none, INVALID_ARGUMENT for a model
the repository does not hold or that failed to load, or load parameters (not supported).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeAlias

import grpc
from tritonclient.grpc import service_pb2 as pb

from temper.artifacts.formats.repository import LoadFailed
from temper.artifacts.serving.models import ControlDisabled, Models

Context: TypeAlias = grpc.ServicerContext


class RepositoryRpcs:
    """The repository RPCs of GRPCInferenceService, for a servicer that sets `models`."""

    models: Models

    def RepositoryIndex(self, request: pb.RepositoryIndexRequest,
                        context: Context) -> pb.RepositoryIndexResponse:
        """Every model of the repository, as Triton lists them (artifacts/serving/models.py: Models.index)."""
        index = pb.RepositoryIndexResponse.ModelIndex
        return pb.RepositoryIndexResponse(models=[index(**entry) for entry in self.models.index(request.ready)])

    def RepositoryModelLoad(self, request: pb.RepositoryModelLoadRequest,
                            context: Context) -> pb.RepositoryModelLoadResponse:
        """Load (or reload, when the repository has a newer version) and warm up, answering once it is ready."""
        if request.parameters:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "load parameters (Triton's config override, model files) "
                                                            "are not supported")
        self._control(self.models.load, request.model_name, context)
        return pb.RepositoryModelLoadResponse()

    def RepositoryModelUnload(self, request: pb.RepositoryModelUnloadRequest,
                              context: Context) -> pb.RepositoryModelUnloadResponse:
        self._control(self.models.unload, request.model_name, context)
        return pb.RepositoryModelUnloadResponse()

    @staticmethod
    def _control(action: Callable[[str], object], name: str, context: Context) -> None:
        """Triton's codes: UNAVAILABLE in model control mode none, INVALID_ARGUMENT for a model that cannot load."""
        try:
            action(name)
        except ControlDisabled as exc:
            context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        except LoadFailed as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
