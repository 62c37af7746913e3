"""`pyrula-fleet bench` runs end to end on the embedded store and reports its figures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"


def test_fleet_bench_reports_figures(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYRULA_")}
    env["PYTHONPATH"] = str(SRC)
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "-c", "from pyrula.cli.fleet import main; main()", "bench",
         "-n", "2", "--runs", "60", "--steps", "2", "--json", str(out)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert figures["runs"] == 60 and figures["steps"] == 2 and figures["children"] == 2
    assert figures["runs_per_s"] > 0 and figures["seconds"] > 0
