"""Health probes listen on loopback unless told otherwise: the worker's and the fleet's
server bind 127.0.0.1 by default, and ``health_host`` / ``--health-host`` move them (here to
127.0.0.2, another loopback address, so nothing is exposed even then). Read from the
listening sockets themselves (psutil), not from what the process says."""

from __future__ import annotations

import asyncio
import os

import psutil

from pyrula.workflows import MemoryStore, WorkerOptions, WorkflowWorker
from tests.conftest import await_until, wait_until
from tests.fleet.fleetprocs import Fleet, Fleets
from tests.integration.valkey_support import one_step


def _listening(pid: int, port: int) -> list[str]:
    """The addresses process ``pid`` listens on at TCP ``port``."""
    return sorted(
        c.laddr.ip for c in psutil.Process(pid).net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN and c.laddr.port == port
    )


async def _worker_listens_on(options: WorkerOptions) -> list[str]:
    worker = WorkflowWorker(store=MemoryStore(), workflows=[one_step], options=options,
                            cloud=False)
    task = asyncio.create_task(worker.run())
    try:
        address = await await_until(lambda: worker.health_address, timeout=15,
                                    what="the health server to bind")
        return _listening(os.getpid(), address[1])
    finally:
        worker.stop()
        await asyncio.wait_for(task, 30)


async def test_the_worker_health_server_binds_loopback_unless_told_otherwise() -> None:
    assert await _worker_listens_on(WorkerOptions(health_port=0)) == ["127.0.0.1"]
    assert await _worker_listens_on(
        WorkerOptions(health_port=0, health_host="127.0.0.2")) == ["127.0.0.2"]


def _fleet_listens_on(fleet: Fleet) -> list[str]:
    assert fleet.port is not None
    return wait_until(lambda: _listening(fleet.pid, fleet.port or 0), timeout=30,
                      what="the fleet's health port to listen")


def test_the_fleet_health_server_binds_loopback_unless_told_otherwise(fleets: Fleets) -> None:
    default = fleets.start("-n", "1")
    assert _fleet_listens_on(default) == ["127.0.0.1"]
    moved = fleets.start("-n", "1", "--health-host", "127.0.0.2", name="moved")
    assert _fleet_listens_on(moved) == ["127.0.0.2"]
    # Nothing of either fleet (the supervisor or its children) listens anywhere else.
    for fleet, host in ((default, "127.0.0.1"), (moved, "127.0.0.2")):
        family = [psutil.Process(fleet.pid), *psutil.Process(fleet.pid).children(True)]
        for proc in family:
            for conn in proc.net_connections(kind="inet"):
                if conn.status == psutil.CONN_LISTEN:
                    assert conn.laddr.ip == host, (proc.pid, conn)
