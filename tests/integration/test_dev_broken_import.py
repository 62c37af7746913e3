"""`pyrula dev` survives a code change that breaks the import: it waits for the next one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.conftest import wait_until

SRC = Path(__file__).resolve().parents[2] / "src"

GOOD = '''
from pyrula.workflows import workflow

@workflow(name="devapp_hello")
async def hello(ctx, params):
    return "hi"
'''


def test_dev_waits_for_a_fix_after_a_broken_import_then_serves(tmp_path: Path) -> None:
    (tmp_path / "devapp.py").write_text("raise RuntimeError('half-written code')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYRULA_")}
    env.update(PYTHONPATH=str(SRC), PYRULA_STORE_URL=f"sqlite:///{tmp_path / 'dev.db'}")
    log = tmp_path / "dev.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pyrula.cli", "dev", "--app", "devapp"],
            cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT,
        )
    try:
        wait_until(lambda: "waiting for a change" in log.read_text(), timeout=30,
                   what="dev to wait for a fix")
        assert proc.poll() is None, "pyrula dev exited on a broken import"
        (tmp_path / "devapp.py").write_text(GOOD)
        wait_until(lambda: "worker_started" in log.read_text(), timeout=30,
                   what="the fixed app to be served")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "half-written code" in log.read_text()
