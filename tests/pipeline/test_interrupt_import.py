"""A SIGTERM or SIGINT that arrives while a module is being imported is delivered once the import is over, not
inside it: torch's C++ imports modules through pybind11, where an exception raised by temper's handler aborted
the process (`terminate called ... Interrupted: 15`, exit 134) and left the run's partial folders behind (seen in
tests/pipeline/test_cli_contract.py's interrupted-run test, when the signal met torch's import)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = """
import signal, time
from temper.artifacts.core.errors import Interrupted
from temper.pipeline.cli import _interrupt

signal.signal(signal.SIGTERM, _interrupt)
try:
    import slow_module  # signals itself, then keeps importing for 0.3 s
    print("imported", slow_module.DONE, flush=True)
    time.sleep(5)
    print("never interrupted")
except Interrupted as exc:
    print("interrupted", exc.signum)
"""


def test_an_interrupt_during_an_import_is_delivered_after_it(tmp_path: Path) -> None:
    (tmp_path / "slow_module.py").write_text("import os, signal, time\nos.kill(os.getpid(), signal.SIGTERM)\n"
                                             "time.sleep(0.3)\nDONE = True\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["imported", "True", "interrupted", "15"], result.stdout + result.stderr
