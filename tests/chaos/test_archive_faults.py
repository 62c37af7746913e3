"""Postgres killed (``pg_ctl stop -m immediate``) and started again while a fleet over
Valkey archives its finished runs: the runs keep running (the archive is off their path),
and once Postgres answers the drain resumes by itself: every finished run reaches the
archive exactly once (one row, its whole journal), none is missing."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from pyrula.workflows import SyncWorkflowClient, ValkeyStore
from tests.chaos.archive import archived_count, archiving_fleet, check_archive, wait_archived
from tests.chaos.harness import ChaosLoad
from tests.fleet.fleetprocs import Fleets
from tests.pgcluster import PgCluster

pytestmark = pytest.mark.slow

OUTAGES = 2
DOWN_S = 2.0


def test_postgres_killed_during_archive_drain(fleets: Fleets, tmp_path: Path, valkey_url: str,
                                              valkey_namespace: str,
                                              pg_cluster: PgCluster) -> None:
    store = ValkeyStore(valkey_url, namespace=valkey_namespace)
    try:
        load = ChaosLoad(SyncWorkflowClient(store), tmp_path, steps=3, hold=0.05, seed=21)
        fleet = archiving_fleet(fleets, valkey_url, valkey_namespace, pg_cluster)
        load.submit(300)
        down_at = [0.0]
        archived_before = [0]  # what the archive held at the last stop

        def nemesis() -> bool:
            stops = load.count("postgres stop -m immediate")
            if pg_cluster.running:
                held = archived_count(pg_cluster.dsn, valkey_namespace, list(load.expected))
                if stops < OUTAGES and held > archived_before[0]:
                    # In the middle of the drain (which resumed since the last outage).
                    archived_before[0] = held
                    pg_cluster.stop("immediate")
                    load.fault("postgres stop -m immediate", pg_cluster.port)
                    down_at[0] = time.monotonic()
                    load.submit(150)  # runs that end while the archive is down
            elif time.monotonic() - down_at[0] >= DOWN_S:
                pg_cluster.start()
                load.fault("postgres start", pg_cluster.port)
            return pg_cluster.running is False or stops < OUTAGES

        load.wait_all(timeout=120, during=nemesis)
        assert load.count("postgres stop -m immediate") == load.count("postgres start") \
            == OUTAGES
        report = load.verdict(store, [fleet.log()])
        load.assert_holds(report)
        assert not report.faults and not load.requeues(), (report.faults, load.requeues())

        have = wait_archived(pg_cluster.dsn, valkey_namespace, list(load.expected), 60)
        archive = check_archive(pg_cluster.dsn, valkey_namespace, load.journals)
        print(archive.line())
        assert archive.ok and archive.extra == 0, (have, archive.line(), archive.problems)
        log = fleet.log()
        # The outage was met, said once per outage per process, and recovered from.
        assert "archive_unavailable" in log and "archive_recovered" in log
        assert "archive_reconciled" in log  # the runs the outage left were drained later
        assert "archive_lost" not in log and "archive_failed" not in log
        assert "Traceback" not in log
        status = fleet.wait_ready(2, timeout=30)
        assert status["restarts"] == 0, status
        fleet.send(signal.SIGTERM)
        assert fleet.wait(60) == 0
    finally:
        store.close()
