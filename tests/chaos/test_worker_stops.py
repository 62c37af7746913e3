"""SIGSTOP a busy child under load, then SIGCONT it: a frozen worker (its event loop, its
lock-renewal thread and its sync steps all stop) loses its runs to the rest of the fleet,
which finish them exactly once, and whatever the frozen one still tries to write when it
wakes is refused by the store (fencing).

Two ways the fleet gets the runs back:

* stopped past ``--child-timeout``: the supervisor kills the silent child, replaces it and
  requeues its runs at once (the SIGCONT then finds it dead);
* stopped past ``--lock-ttl`` but well within ``--child-timeout``: the supervisor leaves
  it alone, the other child's orphan scan takes its runs once their locks lapse, and the
  woken child's writes (a sync step in flight when it froze returns, the renewal thread
  renews) are refused: ``stale_writes_refused > 0``.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from pyrula.workflows import SyncWorkflowClient, ValkeyStore
from tests.chaos.harness import APP, ChaosLoad, count_in_log, held_by, resume, stop_child
from tests.conftest import wait_until
from tests.fleet.fleetprocs import QUICK, Fleet, Fleets

pytestmark = pytest.mark.slow

#: How a text-format log line says a fenced write of the attempt was refused
#: (``run_lock_lost``).
LOCK_LOST = "lock lost to another attempt"


def test_a_child_stopped_past_child_timeout_is_replaced_and_its_runs_finish_once(
    fleets: Fleets, tmp_path: Path, valkey_url: str, valkey_namespace: str
) -> None:
    store = ValkeyStore(valkey_url, namespace=valkey_namespace)
    try:
        load = ChaosLoad(SyncWorkflowClient(store), tmp_path, steps=3, hold=0.05, kind="sync",
                         seed=11)
        fleet = fleets.start("-n", "2", "--namespace", valkey_namespace, "--child-timeout", "3",
                             "--lock-ttl", "5", "--orphan-scan-interval", "1", *QUICK,
                             app=APP, store=valkey_url)
        fleet.wait_ready(2, timeout=60)
        load.submit(120)
        stops = 2
        for cycle in range(stops):
            victim = wait_until(lambda: stop_child(fleet, load), 30, what="a busy child")
            pid = victim["pid"]
            # The supervisor sees no heartbeat for --child-timeout, kills the child and
            # starts another in its slot.
            fleet.wait_status(lambda s, p=pid, n=cycle + 1: s["restarts"] >= n and all(  # type: ignore[misc]
                c["pid"] != p for c in s["children"]), timeout=30, what=f"{pid} replaced")
            resume(pid, load)
            load.submit(50)
        load.wait_all(timeout=90)
        assert sum(f.kind == "SIGSTOP" for f in load.faults) == stops
        log = fleet.log()
        assert log.count("child_unresponsive") == stops, log[-4000:]
        report = load.verdict(store, [log])
        load.assert_holds(report)
        assert set(report.faults) <= {"orphaned"}, report.faults
        status = fleet.wait_ready(2, timeout=30)
        assert status["restarts"] == stops
        fleet.send(signal.SIGTERM)
        assert fleet.wait(60) == 0
    finally:
        store.close()


def freeze_a_holder(fleet: Fleet, load: ChaosLoad) -> dict[str, Any] | None:
    """SIGSTOP a child that holds runs, as the store says (a child's last heartbeat may
    still count runs it has since finished or lost): its /status entry, or None (and no
    child left stopped) when the one stopped held none."""
    victim = stop_child(fleet, load)
    if victim is None or held_by(load, victim["worker_id"]):
        return victim
    resume(victim["pid"], load)
    return None


def test_a_child_stopped_past_its_lock_ttl_loses_its_runs_and_its_late_writes_are_refused(
    fleets: Fleets, tmp_path: Path, valkey_url: str, valkey_namespace: str
) -> None:
    store = ValkeyStore(valkey_url, namespace=valkey_namespace)
    try:
        # Sync steps, so each frozen child has steps on its threads that return when it
        # wakes and try to record themselves.
        load = ChaosLoad(SyncWorkflowClient(store), tmp_path, steps=3, hold=0.1, kind="sync",
                         seed=12)
        fleet = fleets.start("-n", "2", "--namespace", valkey_namespace,
                             "--child-timeout", "120", "--lock-ttl", "2",
                             "--orphan-scan-interval", "0.5", *QUICK, app=APP, store=valkey_url)
        fleet.wait_ready(2, timeout=60)
        load.submit(100)
        stops = 2
        for _ in range(stops):
            reclaimed = count_in_log(fleet, "run_reclaimed")
            victim = wait_until(lambda: freeze_a_holder(fleet, load), 30,
                                what="a child holding runs")
            # Frozen until the other child's orphan scan has taken its runs: a run on a shard
            # the frozen child leases is scanned once that lease lapses (shard_lease_ttl,
            # 30 s), so the wait allows for it. The runs are read from the store, not from
            # the victim's last heartbeat, whose in_flight may count a run it ended since.
            wait_until(lambda v=victim: not held_by(load, v["worker_id"]), 60, interval=0.25,
                       what=f"the runs of frozen {victim['pid']} reclaimed")
            assert count_in_log(fleet, "run_reclaimed") > reclaimed
            lost = count_in_log(fleet, LOCK_LOST)
            resume(victim["pid"], load)
            fleet.wait_for_log_count(LOCK_LOST, lost + 1, timeout=30)
            load.submit(50)
        load.wait_all(timeout=90)
        log = fleet.log()
        assert "child_unresponsive" not in log  # the supervisor never killed it
        report = load.verdict(store, [log])
        load.assert_holds(report)
        assert report.stale_writes_refused > 0
        assert report.faults["orphaned"] > 0  # the frozen steps ran again elsewhere
        assert set(report.faults) == {"orphaned"}, report.faults
        status = fleet.wait_ready(2, timeout=30)
        assert status["restarts"] == 0
        fleet.send(signal.SIGTERM)
        assert fleet.wait(60) == 0
    finally:
        store.close()
