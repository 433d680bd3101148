"""The servers `temper serve` runs: its ports bound before anything loads (a busy port is one line, not a
traceback), worker deaths shown to the operator, and the REST and gRPC servers started and stopped together.
Kept apart from deploy.py, which only parses the flags."""

from __future__ import annotations

import logging
import socket
from typing import TYPE_CHECKING

from temper.artifacts.core.errors import EnvironmentProblem, RecipeError, first_line
from temper.pipeline.cli.common import out

if TYPE_CHECKING:
    from temper.artifacts.serving.models import Models


def show_worker_deaths() -> None:
    """An operator sees each worker death (with its signal) and each instance taken out, which the root
    logger's ERROR level would drop; --debug shows everything already."""
    deaths = logging.getLogger("temper.serving.workers")
    deaths.setLevel(min(logging.getLogger().getEffectiveLevel(), logging.WARNING))
    if not logging.getLogger().handlers and not deaths.handlers:
        deaths.addHandler(logging.StreamHandler())  # one line each on stderr, as the message says it


def listen(model: str, host: str, port: int, grpc_port: int | None) -> socket.socket:
    """The REST socket, bound; the gRPC port checked (its server binds its own once the model is loaded) and
    the grpc extra imported, so that nothing loads before a flag or the environment is known to be wrong."""
    from temper.artifacts.serving.server import bind

    if grpc_port is not None:
        if grpc_port == port:
            raise RecipeError(model, "--grpc-port", f"must differ from --port {port}")
        try:
            from temper.artifacts.serving.grpc_server import GrpcServer  # noqa: F401  (the grpc extra is here)
        except ImportError as exc:
            raise EnvironmentProblem(f"--grpc-port: {first_line(exc)}") from None
    try:
        sock = bind(host, port)
    except socket.gaierror as exc:  # not an address: the flag is wrong, not the host
        raise RecipeError(model, "--host", f"{host!r} is not an address to listen on: {exc.strerror or exc}") \
            from None
    except OSError as exc:
        raise EnvironmentProblem(f"--port: cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    if grpc_port is not None:  # bound for a moment only
        try:
            bind(host, grpc_port).close()
        except OSError as exc:
            sock.close()
            raise EnvironmentProblem(f"--grpc-port: cannot listen on {host}:{grpc_port}: {exc.strerror or exc}") \
                from None
    return sock


def run(model: str, models: Models, what: str, sock: socket.socket, host: str, grpc_port: int | None,
        max_body_mb: float | None, max_connections: int | None, allow_client_shm: bool) -> None:
    """Serve `models` over REST on `sock` (and gRPC on grpc_port) until interrupted."""
    from temper.artifacts.formats.repository import LoadFailed
    from temper.artifacts.serving.client_shm import ClientRegions
    from temper.artifacts.serving.http_limits import MIN_BODY_BYTES, body_limit
    from temper.artifacts.serving.server import serve

    max_body = int(max_body_mb * 1024 * 1024) if max_body_mb is not None else max(
        [body_limit(c) for c in models.configs()], default=MIN_BODY_BYTES)
    names = models.catalog.names()
    route = names[0] if len(names) == 1 else "NAME"
    out.print(f"serving {what} at http://{host}:{sock.getsockname()[1]}/v2/models/{route} once warm "
              "(GET /v2/health/ready answers 200); Ctrl-C stops", soft_wrap=True)
    grpc = None
    regions = ClientRegions(allow_client_shm)  # one namespace for REST and gRPC, as in Triton
    if grpc_port is not None:  # shares the models: ModelInfer answers UNAVAILABLE until the warm-up is done
        from temper.artifacts.serving.grpc_server import GrpcServer

        grpc = GrpcServer(models, host, grpc_port, max_body, regions)
        try:
            grpc.start()
        except OSError as exc:
            raise EnvironmentProblem(f"--grpc-port: {exc}") from None
        out.print(f"serving {what} over gRPC (KServe v2 GRPCInferenceService) at {host}:{grpc_port}", soft_wrap=True)
    try:
        serve(models, sock, max_body, max_connections, regions)
    except LoadFailed as exc:  # a startup model's version cannot be served: the repository's, or this host's
        if isinstance(exc.__cause__, EnvironmentProblem):
            raise EnvironmentProblem(str(exc)) from exc
        raise RecipeError(model, "", str(exc)) from exc
    finally:
        if grpc is not None:
            grpc.stop()
        regions.close()  # every region a client left registered
