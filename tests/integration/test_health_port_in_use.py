"""A health port something else holds is the user's mistake: ``pyrula worker``, ``pyrula dev``
and ``pyrula-fleet start`` each say so in one line (no traceback) and exit 2."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.workerprocs import APP_MODULE, child_env, write_app

IN_USE = ("health port {port} is already in use on 127.0.0.1: pick another --health-port "
          "or stop what holds it")


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield int(taken.getsockname()[1])


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    write_app(tmp_path)
    return subprocess.run(
        [sys.executable, *args, "--app", APP_MODULE, "--store", "sqlite:///store.db"],
        cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=60,
    )


@pytest.mark.parametrize("command", ["worker", "dev"])
def test_a_worker_on_a_taken_health_port_says_so_in_one_line(
    tmp_path: Path, taken_port: int, command: str
) -> None:
    proc = _run(tmp_path, "-m", "pyrula.cli", command, "--health-port", str(taken_port))
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "Errno" not in proc.stderr
    assert proc.stderr.splitlines()[-1] == \
        "error: " + IN_USE.format(port=taken_port)


def test_a_fleet_on_a_taken_health_port_says_so_in_one_line(
    tmp_path: Path, taken_port: int
) -> None:
    proc = _run(tmp_path, "-c", "from pyrula.cli.fleet import main; main()", "start", "-n", "1",
                "--health-port", str(taken_port))
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.splitlines() == [
        f"error: cannot serve the fleet's health probes on 127.0.0.1:"
        f"{taken_port}: {IN_USE.format(port=taken_port)}; --health-port 0 picks a free one"
    ]


async def test_in_code_a_taken_health_port_is_a_configuration_error_and_an_oserror(
    taken_port: int,
) -> None:
    import asyncio
    import errno

    from pyrula.workflows import ConfigurationError, MemoryStore, WorkerOptions, WorkflowWorker
    from tests.integration.valkey_support import one_step

    worker = WorkflowWorker(store=MemoryStore(), workflows=[one_step], cloud=False,
                            options=WorkerOptions(health_port=taken_port))
    with pytest.raises(ConfigurationError) as refused:
        await asyncio.wait_for(worker.run(), 30)
    assert str(refused.value) == IN_USE.format(port=taken_port)
    assert isinstance(refused.value, OSError)
    assert refused.value.errno == errno.EADDRINUSE
