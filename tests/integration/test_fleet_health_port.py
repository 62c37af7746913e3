"""A fleet whose health port is taken says so in one line and exits 2."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"


def test_a_taken_health_port_is_a_clear_configuration_error(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYRULA_")}
    env["PYTHONPATH"] = str(SRC)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-c", "from pyrula.cli.fleet import main; main()", "start",
             "-n", "1", "--app", "pyrula.examples.orders", "--health-port", str(port)],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
        )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"cannot serve the fleet's health probes on 127.0.0.1:{port}" in proc.stderr
    assert "Traceback" not in proc.stderr
