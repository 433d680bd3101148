"""`temper serve --grpc-port` from the command line: one process serving REST and gRPC, and the
one-line errors when gRPC is not installed or the ports clash."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import onnxruntime as ort
import pytest

pytest.importorskip("grpc")
tritongrpc = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException  # noqa: E402

from tests.artifacts import grpc_servers  # noqa: E402
from tests.artifacts.grpc_servers import _correct, _infer  # noqa: E402
from tests.artifacts.servers import _expected, _free_port, _inputs  # noqa: E402
from tests.helpers import REPO  # noqa: E402

# the gRPC fixtures, over conftest.py's HTTP ones of the same names
tiny = grpc_servers.tiny


# -- the CLI -------------------------------------------------------------------------------------


def test_temper_serve_with_grpc_port(tiny: Path, reference: ort.InferenceSession) -> None:
    """One process serves REST and gRPC from the same runtime; Ctrl-C stops both."""
    port, grpc_port = _free_port(), _free_port()
    code = "import sys; from temper.pipeline.cli import main; sys.argv[0] = 'temper'; main()"
    process = subprocess.Popen([sys.executable, "-c", code, "serve", str(tiny), "--port", str(port),
                                "--grpc-port", str(grpc_port)], cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        c = tritongrpc.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        for _ in range(600):  # up to 60 s for start-up and warm-up
            assert process.poll() is None, process.communicate()
            try:
                if c.is_server_ready():
                    break
            except InferenceServerException:
                pass  # not listening yet
            time.sleep(0.1)
        inputs = _inputs(13, rows=4)
        assert _correct(_infer(c, inputs), _expected(reference, inputs))
        c.close()
    finally:
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=30)
    # a graceful stop; main() may report the Ctrl-C uvicorn re-raises after shutting down as 128 + SIGINT
    assert process.returncode in (0, 128 + signal.SIGINT) and "Traceback" not in stderr, stderr
    assert f"127.0.0.1:{grpc_port}" in stdout and "gRPC" in stdout


def test_grpc_port_without_grpc_installed_is_one_line_exit_3(temper, tiny: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "grpc", None)  # `import grpc` now fails as if it were not installed
    monkeypatch.delitem(sys.modules, "temper.artifacts.serving.grpc_server")
    result = temper("serve", tiny, "--grpc-port", "8101")
    lines = result.stderr.strip().splitlines()
    assert result.code == 3 and len(lines) == 1, result.stderr
    assert lines[0].startswith("error: --grpc-port: ") and "temper-ml[grpc]" in lines[0]


def test_grpc_port_equal_to_port_is_refused(temper, tiny: Path) -> None:
    result = temper("serve", tiny, "--port", "8102", "--grpc-port", "8102")
    assert result.code == 2 and "--grpc-port" in result.stderr and "must differ" in result.stderr


def test_a_busy_grpc_port_is_one_line_before_the_model_loads(temper, tiny: Path) -> None:
    """Found before loading: nothing says it is serving (on main the model loaded and 'serving ...'
    was printed first)."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        grpc_port = busy.getsockname()[1]
        result = temper("serve", tiny, "--port", _free_port(), "--grpc-port", grpc_port)
    (line,) = result.stderr.strip().splitlines()
    assert result.code == 3 and "serving" not in result.stdout, result
    assert line.startswith(f"error: --grpc-port: cannot listen on 127.0.0.1:{grpc_port}") and "in use" in line, line
