"""Repeated kill -9 of random children under load: nothing lost, nothing completed twice, no
recorded step run again; every re-run is one the kill caused, inside the window."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from pyrula.workflows import SQLiteStore, SyncWorkflowClient, ValkeyStore
from pyrula.workflows.stores.base import Store
from tests.chaos.harness import APP, ChaosLoad, kill_random_child, periodic
from tests.fleet.fleetprocs import QUICK, STORE_FILE, Fleets

KILLS = 6


def _kill_storm(fleets: Fleets, tmp_path: Path, store: Store, store_url: str,
                *extra: str) -> None:
    client = SyncWorkflowClient(store)
    load = ChaosLoad(client, tmp_path, steps=3, hold=0.05, seed=7)
    # Six kills within seconds can land on one run four times, which the poison limit
    # would rightly quarantine; this scenario is about loss and re-runs, so it is raised.
    # Each kill makes suspects of the runs in user code, run one at a time per child
    # afterwards: 20 slots a child keep that drain short.
    fleet = fleets.start("-n", "2", "--lock-ttl", "5", "--orphan-scan-interval", "1",
                         "--poison-max-retries", "10", "--max-concurrent-runs", "20",
                         *QUICK, *extra, app=APP, store=store_url)
    fleet.wait_ready(2, timeout=60)
    load.submit(300)
    # A kill lands only where runs are in flight (a child reports them as it claims).
    nemesis = periodic(load, "kill -9", KILLS, 0.5,
                       lambda: kill_random_child(fleet, load) is not None)

    load.wait_all(timeout=120, during=nemesis)
    assert sum(f.kind == "kill -9" for f in load.faults) == KILLS
    report = load.verdict(store, [fleet.log()])
    load.assert_holds(report)
    # The re-runs are the kills' doing: their runs were requeued as orphans.
    assert set(report.faults) <= {"orphaned"}, report.faults
    status = fleet.wait_ready(2, timeout=60)
    assert status["restarts"] == KILLS
    fleet.send(signal.SIGTERM)
    assert fleet.wait(60) == 0


@pytest.mark.slow
def test_kill_storm_on_the_embedded_sqlite_store(fleets: Fleets, tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / STORE_FILE)
    try:
        _kill_storm(fleets, tmp_path, store, f"sqlite:///{STORE_FILE}")
    finally:
        store.close()


@pytest.mark.slow
def test_kill_storm_on_valkey(fleets: Fleets, tmp_path: Path, valkey_url: str,
                              valkey_namespace: str) -> None:
    store = ValkeyStore(valkey_url, namespace=valkey_namespace)
    try:
        _kill_storm(fleets, tmp_path, store, valkey_url, "--namespace", valkey_namespace)
    finally:
        store.close()
