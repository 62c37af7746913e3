"""What `make run` starts: the example app served by a fleet on the embedded SQLite store."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"


def test_the_example_app_runs_through_the_fleet_and_drains(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYRULA_")}
    env["PYTHONPATH"] = str(SRC)
    # The fleet's default health port stands in for 8081 (a fixed port another test or
    # program may hold): the example serves it when free, as it would serve 8081.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        env["PORT"] = str(sock.getsockname()[1])
    proc = subprocess.run(
        [sys.executable, "-m", "pyrula.examples", "--db", str(tmp_path / "demo.db"),
         "--runs", "5"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=90,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    first = re.match(r"dashboard: http://127\.0\.0\.1:(\d+)/ ", out)  # first line
    assert first, out[:500]
    assert first[1] == env["PORT"], out[:500]
    assert f"\nmetrics: curl -s http://127.0.0.1:{first[1]}/metrics\n" in out, out[:500]
    assert "pyrula-fleet -n 2" in out
    completed = [line for line in out.splitlines() if "order-" in line and "completed" in line]
    assert len(completed) == 5, out
    assert "sending 'approved'" in out  # order 5 waited for its signal and got it
    assert "nightly_digest" in out and "continued" in out
    assert out.rstrip().endswith("drained; bye")
