"""One inference worker process: the engine session of one instance, apart from the gateway.

Started by artifacts/serving/workers.py as `python -m temper.artifacts.serving.worker SPEC` with three inherited file
descriptors: its control socket (SOCK_SEQPACKET, one message per descriptor) and its input and
output regions (artifacts/serving/tensor_memory.py). It builds the session exactly as the gateway would
(artifacts/engines/: ONNX Runtime with the SessionSettings the gateway chose, or OpenVINO with the
compiled model's settings the gateway read back), says so once, then runs batches
until the socket closes: a batch descriptor names the input tensors in the input region, the
outputs go into the output region and their descriptor back.

A crash in native code here (a segfault, the OOM killer) ends this process only: the gateway sees
the socket close, fails the batch it had sent, and starts a new worker.

SIGINT and SIGTERM are ignored: Ctrl-C in a terminal (or a service manager signalling the whole group)
reaches the workers too, and the gateway must drain first; it ends a worker by closing its socket,
and a gateway that dies closes it too, so no worker outlives it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
from pathlib import Path
from typing import Any

from temper.artifacts import engines
from temper.artifacts.core.errors import first_line
from temper.artifacts.engines.providers import provider_named
from temper.artifacts.serving.tensor_memory import Region

MAX_MESSAGE = 1 << 20  # a descriptor is a few hundred bytes; this bounds a model with very many tensors


class Channel:
    """One end of the control socket: JSON messages, one per SOCK_SEQPACKET packet, received into a
    buffer allocated once (a fresh MAX_MESSAGE-byte recv() costs tens of microseconds a call). Used by
    one thread at a time."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._buffer = bytearray(MAX_MESSAGE)

    def send(self, message: dict[str, Any]) -> None:
        self.sock.send(json.dumps(message, separators=(",", ":")).encode())

    def receive(self) -> dict[str, Any] | None:
        """The next message, None once the other side has closed its end (or died)."""
        size = self.sock.recv_into(self._buffer)
        return json.loads(self._buffer[:size]) if size else None

    def settimeout(self, seconds: float | None) -> None:
        self.sock.settimeout(seconds)

    def shutdown(self) -> None:
        self.sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.sock.close()


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    spec = json.loads(argv[0])
    channel = Channel(socket.socket(fileno=spec["control_fd"]))
    inputs = Region(spec["input_fd"], spec["input_size"])
    outputs = Region(spec["output_fd"], spec["output_size"])
    try:
        session, engine = _load(spec)
    except Exception as exc:  # noqa: BLE001 - any load failure: the gateway reports it as the start-up error
        channel.send({"error": first_line(exc)})
        return 1
    names = [o.name for o in session.get_outputs()]
    channel.send({"ready": True, "pid": os.getpid(), "engine": engine, "providers": session.get_providers()})
    try:
        while (message := channel.receive()) is not None:
            try:
                feed = inputs.read([tuple(t) for t in message["inputs"]], message["size"], copy=False)
                results = dict(zip(names, session.run(names, feed)))
                del feed
                descriptor = outputs.write(results)
            except Exception as exc:  # noqa: BLE001 - the model's own failure: this batch fails, the worker serves on
                channel.send({"error": first_line(exc)})
                continue
            channel.send({"outputs": descriptor, "size": outputs.size})
    except OSError:  # the gateway went away mid-batch
        pass
    return 0


def _load(spec: dict[str, Any]) -> tuple[Any, str]:
    """The instance's engine, built from the spec as the gateway built its own."""
    engine = provider_named(spec["provider"])
    runtime = engines.of(engine)
    session, row, _ = runtime.serve(Path(spec["model"]), engine, runtime.settings.model_validate(spec["settings"]),
                                    spec["providers"] or None, spec["name"])
    return session, row


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
