"""The Valkey store failing under a loaded fleet: the server killed and restarted from its
append-only file, the server gone for a while, its script cache flushed. No run is lost or
completed twice, no recorded step runs again, and the fleet recovers without replacing a
child: the store reconnects and reloads its script, the runs caught in an outage are put
back (``run:requeued`` reason ``store_unavailable``)."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from pyrula.workflows import SyncWorkflowClient, ValkeyStore
from tests.chaos.harness import APP, ChaosLoad
from tests.fleet.fleetprocs import QUICK, Fleet, Fleets
from tests.servers import Server, start_server

pytestmark = pytest.mark.slow


def _durable_server(tmp_path: Path) -> Server:
    # Every write is on disk before it is acknowledged: a restart loses nothing.
    return start_server(tmp_path / "valkey", appendonly="yes", appendfsync="always")


def _fleet(fleets: Fleets, server: Server, *extra: str) -> Fleet:
    fleet = fleets.start("-n", "2", "--namespace", "chaos", "--orphan-scan-interval", "1",
                         *QUICK, *extra, app=APP, store=server.url)
    fleet.wait_ready(2, timeout=60)
    return fleet


def _store(server: Server) -> ValkeyStore:
    return ValkeyStore(server.url, namespace="chaos", socket_timeout=2.0)


def _busy(fleet: Fleet) -> bool:
    status = fleet.status()
    return status is not None and sum(c["in_flight"] for c in status["children"]) > 0


def _drain(fleet: Fleet) -> None:
    fleet.send(signal.SIGTERM)
    assert fleet.wait(60) == 0


RESTARTS = 2


def test_valkey_killed_and_restarted_under_load(fleets: Fleets, tmp_path: Path) -> None:
    server = _durable_server(tmp_path)
    store = _store(server)
    try:
        load = ChaosLoad(SyncWorkflowClient(store), tmp_path, steps=3, hold=0.1, seed=11)
        fleet = _fleet(fleets, server)
        load.submit(300)
        last = [time.monotonic()]

        def nemesis() -> bool:
            done = load.count("valkey kill -9")
            if done < RESTARTS and time.monotonic() - last[0] >= 1.0:
                if not _busy(fleet):
                    load.submit(100)
                    return True
                server.kill()
                load.fault("valkey kill -9", server.pid)
                server.launch(keep_port=True)  # the same port and data directory
                server.wait_ready()
                last[0] = time.monotonic()
                load.submit(100)
            return load.count("valkey kill -9") < RESTARTS

        load.wait_all(timeout=120, during=nemesis)
        assert load.count("valkey kill -9") == RESTARTS
        report = load.verdict(store, [fleet.log()])
        load.assert_holds(report)
        assert set(report.faults) <= {"store_unavailable"}, report.faults
        status = fleet.wait_ready(2, timeout=30)
        assert status["restarts"] == 0, status
        _drain(fleet)
    finally:
        store.close()
        server.kill()

