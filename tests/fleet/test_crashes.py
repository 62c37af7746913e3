"""Children that die or freeze under load: replaced in their slot, their runs finished.

Where a fleet keeps the default ``lock_ttl`` (15 s) and orphan scan (60 s), a run of a dead
child finishes within the test's deadline only because the supervisor requeued it at once
(a dead child's runs are recovered by its supervisor), not because its lock lapsed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from pyrula.workflows import RunFailed, RunHandle, RunInfo, SyncWorkflowClient
from tests.fleet.fleetprocs import QUICK, STORE_FILE, Fleets, pids, ready


def _of(journal: list[dict[str, Any]], type_: str, **fields: Any) -> list[dict[str, Any]]:
    return [e for e in journal
            if e["type"] == type_ and all(e.get(k) == v for k, v in fields.items())]


def _assert_no_recorded_step_ran_again(fleets: Fleets, client: SyncWorkflowClient,
                                       runs: list[tuple[str, RunHandle]], killed: int) -> None:
    """Every step is recorded once. A step ran twice only inside the documented window:
    its first execution was in the killed child, which died before recording it, and the
    recorded completion is the later attempt's."""
    for tag, run in runs:
        journal = client.events(run.run_id)
        second_start = [e["seq"] for e in _of(journal, "run:started") if e["attempt"] >= 2]
        for step in ("step_a", "step_b"):
            completed = _of(journal, "step:completed", step=step)
            assert len(completed) == 1, (tag, step, journal)
            ran = fleets.ran(step, tag)
            if len(ran) == 1:
                continue
            assert len(ran) == 2 and ran[0] == killed and ran[1] != killed, (tag, step, ran)
            assert second_start and completed[0]["seq"] > second_start[0], (tag, step, journal)


def test_a_child_killed_under_load_is_replaced_and_loses_no_run(
    fleets: Fleets, client: SyncWorkflowClient
) -> None:
    # A run claimed in the instant of the kill, before the child could report it, is
    # left to the orphan scan: a short lock_ttl is the backstop for that window.
    fleet = fleets.start("-n", "2", "--lock-ttl", "5", "--orphan-scan-interval", "1", *QUICK)
    before = pids(fleet.wait_ready(2))
    runs = [(f"k{i}", client.submit("fa_load", {"tag": f"k{i}"})) for i in range(60)]

    # Kill the busiest child while it has runs in flight (as its heartbeat reports them).
    busy = fleet.wait_status(lambda s: any(c["in_flight"] >= 3 for c in ready(s)),
                             what="a child with runs in flight")
    victim = max(busy["children"], key=lambda c: c["in_flight"])
    killed_at = time.monotonic()
    os.kill(victim["pid"], signal.SIGKILL)

    slot = victim["slot"]
    replaced = fleet.wait_status(
        lambda s: any(c["slot"] == slot and c["pid"] != victim["pid"] and c["state"] == "ready"
                      for c in s["children"]),
        what=f"a new ready child in slot {slot}")
    respawn_s = time.monotonic() - killed_at
    assert pids(replaced)[slot] not in before.values()
    assert {c["slot"]: c["restarts"] for c in replaced["children"]} == {
        s: (1 if s == slot else 0) for s in before}
    assert replaced["restarts"] == 1

    for tag, run in runs:
        assert client.result(run.run_id, timeout=30) == ["a", "b"], tag
    finished_s = time.monotonic() - killed_at
    print(f"kill -9 under load: replacement ready after {respawn_s:.3f} s, "
          f"all 60 runs finished {finished_s:.3f} s after the kill")

    _assert_no_recorded_step_ran_again(fleets, client, runs, victim["pid"])
    # The killed child held runs; the supervisor requeued them (a second attempt each).
    retried = [run for _, run in runs if client.get(run.run_id).attempt == 2]
    assert retried, "the killed child's runs were not run again"
    for run in retried:
        requeued = _of(client.events(run.run_id), "run:requeued")
        assert [e["reason"] for e in requeued] == ["orphaned"]
    # ... by the supervisor, at once, from what the child had reported.
    assert f"runs of dead child {victim['worker_id']} requeued" in fleet.log()

    fleet.send(signal.SIGTERM)
    assert fleet.wait() == 0


def test_a_stopped_child_is_killed_after_child_timeout_and_its_runs_finish_elsewhere(
    fleets: Fleets, client: SyncWorkflowClient
) -> None:
    fleet = fleets.start("-n", "2", "--child-timeout", "2", *QUICK)
    fleet.wait_ready(2)
    runs = {f"s{i}": client.submit("fa_gated", {"tag": f"s{i}"}) for i in range(4)}
    busy = fleet.wait_status(lambda s: sum(c["in_flight"] for c in s["children"]) == 4,
                             what="4 runs in flight")
    victim = max(busy["children"], key=lambda c: c["in_flight"])
    assert victim["in_flight"] > 0
    stopped_at = time.monotonic()
    os.kill(victim["pid"], signal.SIGSTOP)

    slot = victim["slot"]
    fleet.wait_status(
        lambda s: any(c["slot"] == slot and c["pid"] != victim["pid"] and c["state"] == "ready"
                      and c["restarts"] == 1 for c in s["children"]),
        what=f"slot {slot} replaced")
    print(f"SIGSTOP: replacement ready {time.monotonic() - stopped_at:.3f} s after the stop "
          "(--child-timeout 2)")
    log = fleet.wait_for_log("child_unresponsive")
    assert f"pid {victim['pid']} sent no heartbeat" in log

    for tag in runs:
        fleets.open_gate(tag)
    results = {tag: client.result(run.run_id, timeout=30) for tag, run in runs.items()}
    assert victim["pid"] not in results.values()
    moved = [tag for tag, run in runs.items() if client.get(run.run_id).attempt == 2]
    assert len(moved) == victim["in_flight"]
    for tag in moved:  # it may have been stopped before or inside the step
        ran = fleets.ran("gated", tag)
        assert ran[-1] == results[tag] != victim["pid"] and ran.count(victim["pid"]) <= 1

    fleet.send(signal.SIGTERM)
    assert fleet.wait() == 0


def _assert_quarantined(fleets: Fleets, client: SyncWorkflowClient, run: RunHandle,
                        tag: str) -> RunInfo:
    with pytest.raises(RunFailed) as failed:
        client.result(run.run_id, timeout=30)
    error = failed.value.error
    assert error["code"] == "max_retries"
    assert error["detail"]["crashes"] == 4
    # The supervisor's evidence of the last crash: how the child ended, its last RSS
    # (0 if it died before the supervisor's first measurement).
    assert error["detail"]["exit_signal"] == "SIGKILL"
    assert error["detail"]["exit"] == "signal SIGKILL"
    assert isinstance(error["detail"]["rss_bytes"], int)
    info = client.get(run.run_id)
    assert info.status == "failed" and info.attempt == 4
    assert len(fleets.ran("die", tag)) == 4  # poison_max_retries (3) + 1
    journal = client.events(run.run_id)
    assert [e["reason"] for e in _of(journal, "run:requeued")] == ["orphaned"] * 3
    assert journal[-1]["type"] == "run:error" and journal[-1]["code"] == "max_retries"
    return info


def test_a_run_that_kills_its_child_at_once_is_quarantined_on_the_fourth_crash(
    fleets: Fleets, client: SyncWorkflowClient
) -> None:
    # The step kills its process as soon as it starts, before any periodic heartbeat
    # could report the run: the child reports every claim before running it, so each
    # crash is recovered by the supervisor at once (default lock_ttl 15 s, scan 60 s).
    fleet = fleets.start("-n", "2", *QUICK)
    fleet.wait_ready(2)
    poison = client.submit("fa_poison", {"tag": "p"})
    _assert_quarantined(fleets, client, poison, "p")
    status = fleet.wait_ready(2)
    assert status["restarts"] == 4
    assert "run_quarantined" in fleet.log()
    fleet.send(signal.SIGTERM)
    assert fleet.wait() == 0


def test_the_fleet_keeps_serving_while_a_poison_run_crashes_its_children(
    fleets: Fleets, client: SyncWorkflowClient
) -> None:
    # A run claimed by a child in the very moment another thread of it crashes the
    # process is not reported in time; the orphan scan is its backstop here.
    fleet = fleets.start("-n", "2", "--lock-ttl", "3", "--orphan-scan-interval", "1", *QUICK)
    fleet.wait_ready(2)
    poison = client.submit("fa_poison", {"tag": "p", "delay": 0.2})

    # Short runs submitted one after another complete while the poison run crash-loops.
    # (One that shares a child with it at a crash is charged that crash only if it was
    # inside its own code, and never a second one: it then runs apart from the poison run,
    # see the test below.)
    fleet.wait_status(lambda s: s["restarts"] >= 1, what="the first crash")
    served = []
    while not client.get(poison.run_id).status.terminal:
        run = client.submit("fa_version", {})
        assert client.result(run.run_id, timeout=30) == "v1"
        served.append(client.get(run.run_id))

    info = _assert_quarantined(fleets, client, poison, "p")
    assert served[0].finished_at is not None and info.finished_at is not None
    assert served[0].finished_at < info.finished_at
    print(f"poison: {len(served)} other runs completed while it crashed its children")
    assert fleet.wait_ready(2)["restarts"] == 4
    fleet.send(signal.SIGTERM)
    assert fleet.wait() == 0


def _crash_record(directory: Path) -> dict[str, list[float]]:
    """Each run's crashes as the store keeps them for its poison limit (the store's own
    record, read from the fleet's SQLite file)."""
    uri = f"file:{directory / STORE_FILE}?mode=ro"
    with contextlib.closing(sqlite3.connect(uri, uri=True)) as db:
        rows = db.execute("SELECT run_id, crashes FROM runs").fetchall()
    return {str(run_id): json.loads(crashes) for run_id, crashes in rows}


def test_a_poison_run_among_bystanders_is_quarantined_alone(
    fleets: Fleets, client: SyncWorkflowClient
) -> None:
    # One run whose step kills its process at once, queued with 160 runs that each spend
    # 0.2-0.5 s inside a step of their own, 50 at a time per child: its first crash takes
    # dozens of bystanders down with it, inside their own code (tests/fleet/test_suspects.py
    # counts their starts on both stores).
    dwell = {f"b{i}": 0.2 + 0.1 * (i % 4) for i in range(160)}
    bystanders = {tag: client.submit("fa_dwell", {"tag": tag, "seconds": seconds})
                  for tag, seconds in dwell.items()}
    poison = client.submit("fa_poison", {"tag": "p"})
    started = time.monotonic()
    fleet = fleets.start("-n", "2", "--max-concurrent-runs", "50", *QUICK)

    _assert_quarantined(fleets, client, poison, "p")
    quarantined_s = time.monotonic() - started
    for tag, run in bystanders.items():
        assert client.result(run.run_id, timeout=30) == f"{tag} dwelt {dwell[tag]:g} s", tag
    finished_s = time.monotonic() - started

    # No bystander was charged more than one crash, so none came near the poison limit.
    crashes = _crash_record(fleets.directory)
    assert len(crashes[poison.run_id]) == 4
    charged = {tag: len(crashes[run.run_id]) for tag, run in bystanders.items()}
    assert max(charged.values()) <= 1, {t: n for t, n in charged.items() if n > 1}
    # The journals say the same: a requeue that counted a crash carries the run's count.
    reclaimed = {}
    for tag, run in bystanders.items():
        requeued = _of(client.events(run.run_id), "run:requeued", reason="orphaned")
        assert [e["crashes"] for e in requeued if "crashes" in e] == [1] * charged[tag], tag
        reclaimed[tag] = len(requeued)
    # The first crash did take bystanders down; from then on the poison ran alone, so none
    # was in a dead child twice.
    shared = [tag for tag, n in reclaimed.items() if n]
    assert shared, reclaimed
    assert max(reclaimed.values()) <= 1, {t: n for t, n in reclaimed.items() if n > 1}
    print(f"poison among bystanders: quarantined after {quarantined_s:.1f} s, all done after "
          f"{finished_s:.1f} s; {len(shared)} bystanders were in a dead child, "
          f"{sum(charged.values())} charged one crash")
    assert fleet.wait_ready(2)["restarts"] == 4
    fleet.send(signal.SIGTERM)
    assert fleet.wait() == 0
