"""The repository's Procfile runs the fleet under honcho (as foreman or a PaaS would): the
health port comes from ``$PORT``, the store is the embedded default, and honcho's SIGTERM,
sent to the fleet's whole process group, drains it."""

from __future__ import annotations

import os
import shutil
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from pyrula.workflows import SQLiteStore, SyncWorkflowClient
from tests.fleet.fleetprocs import SRC, Fleet, child_env
from tests.servers import free_port

ROOT = SRC.parent
BIN = Path(sys.executable).parent
HONCHO = shutil.which("honcho", path=str(BIN)) or shutil.which("honcho")


@pytest.fixture
def honcho_dir(tmp_path: Path) -> Iterator[Path]:
    """``tmp_path`` with the repository's Procfile; every process started under it is
    killed at teardown (honcho puts the fleet in a session of its own)."""
    shutil.copy(ROOT / "Procfile", tmp_path / "Procfile")
    try:
        yield tmp_path
    finally:
        for proc in psutil.process_iter(["cwd"]):
            try:
                if proc.info["cwd"] == str(tmp_path) and proc.pid != os.getpid():
                    proc.send_signal(signal.SIGCONT)
                    proc.kill()
            except psutil.Error:
                continue


@pytest.mark.needs_tool("honcho (the Procfile test)",
                        None if HONCHO else "honcho is not installed (it is in the dev extra)")
def test_the_procfile_runs_the_fleet_under_honcho_and_sigterm_drains_it(
    honcho_dir: Path,
) -> None:
    procfile = (honcho_dir / "Procfile").read_text()
    assert procfile.startswith("worker: pyrula-fleet start --app pyrula.examples")
    if shutil.which("pyrula-fleet", path=str(BIN)) is None:  # not installed: the module
        (honcho_dir / "Procfile").write_text(procfile.replace(
            "pyrula-fleet", f'{sys.executable} -c "from pyrula.cli.fleet import main; main()"'))
    port = free_port()
    env = child_env(PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    assert HONCHO is not None
    fleet = Fleet(honcho_dir, "honcho", [HONCHO, "start", "-p", str(port)], env, port)
    try:
        status = fleet.wait_ready(2)  # the default -n, on honcho's $PORT
        children = [c["pid"] for c in status["children"]]
        store = SQLiteStore(honcho_dir / "pyrula.db")  # the embedded default store
        try:
            client = SyncWorkflowClient(store)
            runs = [client.submit("process_order", {"order_id": f"o-{i}", "items": ["tea"]})
                    for i in range(6)]
            for run in runs:
                assert client.result(run.run_id, timeout=30)["status"] == "shipped"
        finally:
            store.close()

        fleet.send(signal.SIGTERM)
        # honcho's own exit code is the shell's: dash does not exec the Procfile command,
        # so the shell dies of the SIGTERM (143) while the fleet drains on; not ours.
        fleet.wait(30)
        fleet.wait_for_log("fleet_stopped")
    finally:
        fleet.reap()
    log = fleet.log()
    assert "SIGTERM received" in log
    # Drained: both children ran the worker's shutdown sequence before the fleet stopped,
    # none of them was seen to die.
    assert log.count("worker_stopped") == 2, log
    assert log.index("worker_stopped") < log.index("fleet_stopped"), log
    assert log.count("after draining") == 2 and "died" not in log, log
    for pid in children:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"


def test_the_repository_has_a_procfile_with_a_worker_line() -> None:
    lines = (ROOT / "Procfile").read_text().splitlines()
    assert [line for line in lines if line.startswith("worker:")] == [
        "worker: pyrula-fleet start --app pyrula.examples.orders"]
    # ... a console script of this package.
    assert 'pyrula-fleet = "pyrula.cli.fleet:main"' in (ROOT / "pyproject.toml").read_text()
