"""A worker host's wall clock jumps, +1 h and -1 h, while another host works on the same
Valkey: one fleet runs under libfaketime, its clock moved at run time (only the wall clock,
as an NTP step moves it; the monotonic clock runs on).

* +1 h: the jumped worker steals no lock of a run another worker holds (its orphan scan
  judges locks by the store's clock, not its own), and every sleeping run's timer fires
  exactly once and not before it is due.
* -1 h: nothing stalls: the jumped worker's runs are not taken from it, its timers fire
  when due, every run completes once.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest

from pyrula.invariants import read_ledger
from pyrula.workflows import RunStatus, SyncWorkflowClient, ValkeyStore
from tests.chaos.harness import APP, ChaosLoad, FakeClock, libfaketime, write_chaos_app
from tests.conftest import wait_until
from tests.fleet.fleetprocs import QUICK, Fleet, Fleets, child_env

pytestmark = [
    pytest.mark.slow,
    pytest.mark.needs_tool("libfaketime (clock-jump chaos scenarios)",
                           None if libfaketime() else "no /usr/lib/*/faketime/libfaketime.so.1 "
                           "(make system-deps installs it as root: apt-get install faketime)"),
]

HOUR = 3600.0
SLEEP = 3.0  # each sleeper's durable sleep
OPTIONS = ("--lock-ttl", "2", "--orphan-scan-interval", "0.3", "--timer-poll-interval-s", "0.2")


def _fleet(fleets: Fleets, name: str, url: str, namespace: str, app: str, *options: str,
           env: dict[str, str] | None = None) -> Fleet:
    return fleets.start("-n", "1", "--app", app, "--namespace", namespace, *OPTIONS, *options,
                        *QUICK, app=APP, store=url, name=name, env=env)


def _sleepers(client: SyncWorkflowClient, load: ChaosLoad, count: int) -> dict[str, float]:
    """Submit ``count`` runs that sleep SLEEP s between two steps; run id -> the earliest
    instant (this process's clock) their timer may fire."""
    due = {}
    for i in range(count):
        submitted = time.time()
        run_id = client.submit("chaos.sleeper", {"x": i, "sleep": SLEEP,
                                                 "ledger": str(load.ledger)}).run_id
        load.expect(run_id, i + 2, steps=2)
        due[run_id] = submitted + SLEEP
    return due


def _watch_early(client: SyncWorkflowClient, due: dict[str, float], early: set[str]) -> None:
    """Note every sleeper seen past its sleep before its timer could be due."""
    for run_id, at in due.items():
        if time.time() < at - 0.3 and run_id not in early:
            status = client.get(run_id).status
            if status not in (RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.SLEEPING):
                early.add(run_id)
            elif status is RunStatus.SLEEPING:
                continue
            elif _woken(client.events(run_id)):
                early.add(run_id)


def _woken(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == "run:woken"]


def _assert_timers_fired_once(client: SyncWorkflowClient, due: dict[str, float],
                              early: set[str]) -> None:
    assert not early, f"{len(early)} timers fired before they were due: {sorted(early)[:3]}"
    for run_id in due:
        woken = _woken(client.events(run_id))
        assert [e.get("reason") for e in woken] == ["timer"], (run_id, woken)


def test_a_worker_clock_jumping_forward_steals_no_lock_and_fires_each_timer_once(
    fleets: Fleets, tmp_path: Path, valkey_url: str, valkey_namespace: str
) -> None:
    store = ValkeyStore(valkey_url, namespace=valkey_namespace)
    try:
        client = SyncWorkflowClient(store)
        load = ChaosLoad(client, tmp_path, steps=1, hold=0.0, seed=61)
        app = write_chaos_app(tmp_path)
        gate = tmp_path / "jumped"
        # A holds four runs whose step lasts on for 3 s after the jump (ten of B's orphan
        # scans), renewing their 2 s locks all along; it has no room for more.
        a = _fleet(fleets, "host-a", valkey_url, valkey_namespace, app,
                   "--max-concurrent-runs", "4")
        a.wait_ready(1, timeout=60)
        held = []
        for _ in range(4):
            run_id = client.submit("chaos.drain", {"gate": str(gate), "seconds": 3.0,
                                                   "ledger": str(load.ledger)}).run_id
            load.expect(run_id, 3.0, steps=1)
            held.append(run_id)
        wait_until(lambda: all(client.get(r).status is RunStatus.RUNNING for r in held), 30,
                   what="A holding its four runs")
        clock = FakeClock(tmp_path, child_env())
        b = _fleet(fleets, "host-b", valkey_url, valkey_namespace, app, env=clock.env)
        b.wait_ready(1, timeout=60)
        due = _sleepers(client, load, 20)  # B runs them (A is full) and parks them
        wait_until(lambda: all(client.get(r).status is RunStatus.SLEEPING for r in due), 30,
                   what="the sleepers parked")

        clock.shift(+HOUR)
        load.fault("clock +1h", b.pid)
        gate.touch()
        probe = load.submit(1)[0]  # B runs it: its ledger line shows B's clock
        early: set[str] = set()

        def watch() -> bool:
            _watch_early(client, due, early)
            return False

        load.wait_all(timeout=60, during=watch)
        report = load.verdict(store, [a.log(), b.log()])
        load.assert_holds(report)
        (line,) = [e for e in read_ledger(load.ledger) if e.run_id == probe]
        assert line.ended > time.time() + HOUR - 60, "B's clock did not move"

        assert report.stale_writes_refused == 0 and not report.faults, report.faults
        assert "run_reclaimed" not in b.log()  # B's orphan scan found no lapsed lock
        a_worker = _started(client.events(held[0]))[0]["worker"]
        for run_id in held:  # finished by A in its only attempt
            assert [e["worker"] for e in _started(client.events(run_id))] == [a_worker]
        _assert_timers_fired_once(client, due, early)
        for fleet in (a, b):
            fleet.send(signal.SIGTERM)
            assert fleet.wait(30) == 0
    finally:
        store.close()


def test_a_worker_clock_jumping_back_stalls_nothing(
    fleets: Fleets, tmp_path: Path, valkey_url: str, valkey_namespace: str
) -> None:
    store = ValkeyStore(valkey_url, namespace=valkey_namespace)
    try:
        client = SyncWorkflowClient(store)
        # Steps of 0.5 s: longer than A's orphan scan interval, so a lock B writes on a
        # clock an hour behind would be found lapsed at once.
        load = ChaosLoad(client, tmp_path, steps=2, hold=0.5, seed=62)
        app = write_chaos_app(tmp_path)
        a = _fleet(fleets, "host-a", valkey_url, valkey_namespace, app)
        clock = FakeClock(tmp_path, child_env())
        b = _fleet(fleets, "host-b", valkey_url, valkey_namespace, app, env=clock.env)
        a.wait_ready(1, timeout=60)
        (b_child,) = [c["pid"] for c in b.wait_ready(1, timeout=60)["children"]]
        clock.shift(-HOUR)
        load.fault("clock -1h", b.pid)
        load.submit(60)
        due = _sleepers(client, load, 20)
        early: set[str] = set()

        def watch() -> bool:
            _watch_early(client, due, early)
            return False

        load.wait_all(timeout=60, during=watch)
        report = load.verdict(store, [a.log(), b.log()])
        load.assert_holds(report)
        # B's steps stamped their ledger lines with its clock: an hour behind.
        b_lines = [e for e in read_ledger(load.ledger) if e.pid == b_child]
        assert b_lines, "B's child ran no step"
        assert all(e.ended < time.time() - HOUR + 60 for e in b_lines), "B's clock did not move"
        assert report.stale_writes_refused == 0 and not report.faults, report.faults
        assert "run_reclaimed" not in a.log() + b.log()
        workers = {e["worker"] for r in load.expected for e in _started(client.events(r))}
        assert len(workers) == 2  # B took its share of the load
        for run_id in load.expected:  # nothing was taken over or handed back
            assert not [e for e in client.events(run_id) if e["type"] == "run:requeued"]
        _assert_timers_fired_once(client, due, early)
        for fleet in (a, b):
            fleet.send(signal.SIGTERM)
            assert fleet.wait(30) == 0
    finally:
        store.close()


def _started(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == "run:started"]
