"""The Valkey store failing under a loaded fleet: the server killed and restarted from its
append-only file, the server gone for a while, its script cache flushed. No run is lost or
completed twice, no recorded step runs again, and the fleet recovers without replacing a
child: the store reconnects and reloads its script, the runs caught in an outage are put
back (``run:requeued`` reason ``store_unavailable``)."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from pyrula.workflows import SyncWorkflowClient, ValkeyStore
from tests.chaos.harness import APP, ChaosLoad, periodic
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
        def restart() -> bool:
            if not _busy(fleet):
                return False
            server.kill()
            load.fault("valkey kill -9", server.pid)
            server.launch(keep_port=True)  # the same port and data directory
            server.wait_ready()
            return True

        nemesis = periodic(load, "valkey kill -9", RESTARTS, 1.0, restart, first_after=1.0)

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


def _probe(fleet: Fleet, path: str) -> tuple[int, str]:
    try:
        code, body = fleet.get(path)
    except OSError as exc:  # no answer at all
        return 0, repr(exc)
    return code, json.loads(body).get("status", "") if body.startswith("{") else body


def valkey_outage(fleets: Fleets, tmp_path: Path, seconds: float, runs: int,
                  lock_ttl: float | None = None) -> None:
    """Stop the server mid-load for ``seconds``, watching the fleet's probes all along,
    then start it again on the same port and data directory."""
    server = _durable_server(tmp_path)
    store = _store(server)
    try:
        load = ChaosLoad(SyncWorkflowClient(store), tmp_path, steps=3, hold=0.1, seed=12)
        # Each attempt caught in the outage puts its run back itself when the store answers
        # again, even when the outage outlasted the run's lock (nobody could reclaim it).
        fleet = _fleet(fleets, server, *(("--lock-ttl", str(lock_ttl)) if lock_ttl else ()))
        load.submit(runs)
        ready: list[tuple[int, str]] = []  # /readyz answers during the outage
        live: list[tuple[int, str]] = []  # /livez answers during the outage
        phase = ["load"]
        began = [0.0]

        def nemesis() -> bool:
            if phase[0] == "load" and _busy(fleet):
                server.stop()  # SIGTERM: the server exits; nothing answers on its port
                load.fault("valkey down", server.port)
                phase[0], began[0] = "down", time.monotonic()
            elif phase[0] == "down":
                ready.append(_probe(fleet, "/readyz"))
                live.append(_probe(fleet, "/livez"))
                if time.monotonic() - began[0] >= seconds:
                    server.launch(keep_port=True)
                    server.wait_ready()
                    load.fault("valkey up", server.port)
                    phase[0] = "up"
            elif phase[0] == "load":
                load.submit(20)
            return phase[0] != "up"

        load.wait_all(timeout=120 + seconds, during=nemesis)
        assert load.count("valkey down") == load.count("valkey up") == 1
        report = load.verdict(store, [fleet.log()])
        load.assert_holds(report)
        # The runs in flight met the outage and were put back, for that reason only.
        requeues = load.requeues()
        assert set(requeues) == {"store_unavailable"}, requeues
        assert set(report.faults) <= {"store_unavailable"}, report.faults
        # The fleet said it was not ready while the store was gone, and stayed alive.
        assert (503, "store_unreachable") in ready, ready
        assert all(code == 200 for code, _ in live), live
        assert fleet.wait_status(lambda s: s["status"] == "ok", 30, what="ok again")
        code, word = _probe(fleet, "/readyz")
        assert (code, word) == (200, "ready")
        status = fleet.wait_ready(2, timeout=30)
        assert status["restarts"] == 0, status
        _drain(fleet)
    finally:
        store.close()
        server.kill()


def test_valkey_unreachable_for_longer_than_the_lock_ttl(fleets: Fleets, tmp_path: Path
                                                         ) -> None:
    valkey_outage(fleets, tmp_path, seconds=4.0, runs=300, lock_ttl=2.0)


@pytest.mark.soak
@pytest.mark.timeout(300)
def test_valkey_unreachable_for_ten_seconds(fleets: Fleets, tmp_path: Path) -> None:
    valkey_outage(fleets, tmp_path, seconds=10.0, runs=1000)  # the default lock_ttl, 15 s


FLUSHES = 5


def test_function_flush_under_load(fleets: Fleets, tmp_path: Path) -> None:
    """The store's Lua is a function library: FUNCTION FLUSH (a deploy's cleanup, an
    operator) under load costs each process one reload, and nothing else."""
    server = start_server(tmp_path / "valkey")
    store = _store(server)
    try:
        load = ChaosLoad(SyncWorkflowClient(store), tmp_path, steps=3, hold=0.05, seed=13)
        fleet = _fleet(fleets, server)
        load.submit(300)
        def flush() -> bool:
            if not _busy(fleet):
                return False
            with server.client() as admin:
                admin.function_flush()
            load.fault("FUNCTION FLUSH", server.port)
            return True

        # The test's own submits after each flush meet the flushed library too.
        nemesis = periodic(load, "FUNCTION FLUSH", FLUSHES, 0.3, flush, after=50,
                           first_after=0.3)

        load.wait_all(timeout=120, during=nemesis)
        assert load.count("FUNCTION FLUSH") == FLUSHES
        report = load.verdict(store, [fleet.log()])
        load.assert_holds(report)  # every run completed: none failed for the flush
        # Each flush was met by a call and the library loaded again; nothing else broke.
        assert load.requeues() == {}, load.requeues()
        assert report.rerun_in_window == 0, report.faults
        with server.client() as admin:
            stats = admin.info("commandstats")
            refused = stats.get("cmdstat_fcall", {}).get("failed_calls", 0)
            loads = stats.get("cmdstat_function|load", {}).get("calls", 0)
        print(f"FCALL refused={refused} FUNCTION LOAD calls={loads}")
        assert refused >= FLUSHES and loads >= FLUSHES, (refused, loads)
        assert "Traceback" not in fleet.log()
        status = fleet.wait_ready(2, timeout=30)
        assert status["restarts"] == 0, status
        _drain(fleet)
    finally:
        store.close()
        server.kill()
