"""Everything at once: a fleet over Valkey archiving to Postgres, driven through children
killed with SIGKILL, a Valkey kill -9 and restart, and a Postgres outage (``pg_ctl stop -m
immediate``, then start), while runs keep being submitted. The checker's verdict: no run
lost or completed twice, no recorded step run again, every re-run inside the window and
attributed to its fault, every result right; and every finished run archived exactly
once, with its whole journal.

``make soak`` drives 5,000 runs through 10 kills; ``make test`` a cut of it (800 runs,
3 kills), the same faults otherwise.
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from pyrula.workflows import SyncWorkflowClient, ValkeyStore
from tests.chaos.archive import archiving_fleet, check_archive, wait_archived
from tests.chaos.harness import ChaosLoad, kill_random_child
from tests.fleet.fleetprocs import Fleet, Fleets, ready
from tests.pgcluster import PgCluster
from tests.servers import Server, start_server

pytestmark = pytest.mark.slow

NAMESPACE = "chaos"
#: The faults in the order they are injected; each waits for the one before it to have
#: landed and for the fleet to be busy again.
KILL, VALKEY, PG_STOP, PG_START = "kill -9", "valkey kill -9", "postgres stop", "postgres start"


def plan(kills: int) -> list[str]:
    """``kills`` child kills with the Valkey restart after the first third of them and
    the Postgres outage over a kill of the second third."""
    steps = [KILL] * kills
    third = max(1, kills // 3)
    steps.insert(third, VALKEY)
    steps.insert(2 * third + 1, PG_STOP)
    steps.insert(2 * third + 3, PG_START)  # one kill lands while Postgres is down
    return steps


@dataclass
class Nemesis:
    fleet: Fleet
    load: ChaosLoad
    valkey: Server
    pg: PgCluster
    steps: list[str]
    runs: int
    gap: float = 0.5
    #: Postgres stays down at least this long
    pg_down_s: float = 2.0
    _last: float = 0.0
    _pg_down_at: float = 0.0

    def __call__(self) -> bool:
        status = self.fleet.status()
        in_flight = sum(c["in_flight"] for c in status["children"]) if status else 0
        if len(self.load.expected) < self.runs and in_flight < 80:
            self.load.submit(min(200, self.runs - len(self.load.expected)))
        if not self.steps:
            return len(self.load.expected) < self.runs
        if time.monotonic() - self._last < self.gap or status is None:
            return True
        step = self.steps[0]
        if step == PG_START:
            if time.monotonic() - self._pg_down_at < self.pg_down_s:
                return True
            self.pg.start()
            self.load.fault(PG_START, self.pg.port)
        elif step == PG_STOP:
            self.pg.stop("immediate")
            self.load.fault(PG_STOP, self.pg.port)
            self._pg_down_at = time.monotonic()
        elif len(ready(status)) < 2 or in_flight == 0:
            # A kill or the Valkey restart hits a whole, busy fleet.
            if len(self.load.expected) >= self.runs:
                self.load.submit(100)  # keep the fleet busy until every fault has landed
            return True
        elif step == VALKEY:
            self.valkey.kill()
            self.load.fault(VALKEY, self.valkey.pid)
            self.valkey.launch(keep_port=True)  # the same port and data directory
            self.valkey.wait_ready()
        elif kill_random_child(self.fleet, self.load) is None:
            return True
        self.steps.pop(0)
        self._last = time.monotonic()
        return True


def run_everything(fleets: Fleets, tmp_path: Path, pg: PgCluster, runs: int,
                   kills: int) -> None:
    valkey = start_server(tmp_path / "valkey", appendonly="yes", appendfsync="always")
    store = ValkeyStore(valkey.url, namespace=NAMESPACE, socket_timeout=2.0)
    try:
        load = ChaosLoad(SyncWorkflowClient(store), tmp_path, steps=3, hold=0.02, seed=41)
        fleet = archiving_fleet(fleets, valkey.url, NAMESPACE, pg, "--lock-ttl", "5")
        load.submit(min(400, runs))
        nemesis = Nemesis(fleet, load, valkey, pg, plan(kills), runs)
        began = time.monotonic()
        load.wait_all(timeout=120 + runs / 20, during=nemesis)
        took = time.monotonic() - began
        assert load.count(KILL) == kills and load.count(VALKEY) == 1
        assert load.count(PG_STOP) == load.count(PG_START) == 1
        assert len(load.expected) >= runs
        report = load.verdict(store, [fleet.log()])
        load.assert_holds(report)
        # Every re-run was a kill's (its runs requeued as orphans) or the Valkey restart's.
        assert set(report.faults) <= {"orphaned", "store_unavailable"}, report.faults
        wait_archived(pg.dsn, NAMESPACE, list(load.expected), timeout=120)
        archive = check_archive(pg.dsn, NAMESPACE, load.journals)
        print(archive.line(), f"took={took:.1f}s")
        assert archive.ok, (archive.line(), archive.problems)
        log = fleet.log()
        assert "archive_unavailable" in log and "archive_recovered" in log
        assert "archive_lost" not in log and "archive_failed" not in log
        status = fleet.wait_ready(2, timeout=60)
        assert status["restarts"] == kills, status  # the kills' only: none for the outages
        fleet.send(signal.SIGTERM)
        assert fleet.wait(60) == 0
    finally:
        store.close()
        valkey.kill()


def test_kills_a_valkey_restart_and_a_postgres_outage(fleets: Fleets, tmp_path: Path,
                                                      pg_cluster: PgCluster) -> None:
    run_everything(fleets, tmp_path, pg_cluster, runs=800, kills=3)


@pytest.mark.soak
@pytest.mark.timeout(900)
def test_five_thousand_runs_through_every_store_fault(fleets: Fleets, tmp_path: Path,
                                                      pg_cluster: PgCluster) -> None:
    run_everything(fleets, tmp_path, pg_cluster, runs=5000, kills=10)
