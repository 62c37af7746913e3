"""The fleet's signals, sent for real: TTIN/TTOU scale, HUP replaces children with new code,
TERM/INT drain, and a second one quits at once (143/130)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import psutil
import pytest

from pyrula.workflows import RunStatus, SyncWorkflowClient, ValkeyStore
from tests.conftest import wait_until
from tests.fleet.fleetprocs import (
    APP,
    APP_MODULE,
    QUICK,
    Fleet,
    Fleets,
    StatusRecorder,
    group_alive,
    pids,
)
from tests.fleet.fleetprocs import ready as ready_children
from tests.servers import start_server


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_sigttin_adds_a_child_and_sigttou_drains_one_away(fleets: Fleets) -> None:
    fleet = fleets.start("-n", "2", *QUICK)
    before = pids(fleet.wait_ready(2))

    fleet.send(signal.SIGTTIN)
    grown = fleet.wait_ready(3)
    assert set(pids(grown)) == {0, 1, 2}
    assert {s: p for s, p in pids(grown).items() if s < 2} == before
    added = pids(grown)[2]
    metrics = fleet.get("/metrics")[1]
    assert "pyrula_fleet_children_desired 3" in metrics

    fleet.send(signal.SIGTTOU)
    shrunk = fleet.wait_status(lambda s: len(s["children"]) == 2, what="back to 2 children")
    assert pids(shrunk) == before
    assert shrunk["restarts"] == 0
    # The removed child drained (the worker's shutdown sequence) and exited 0.
    fleet.wait_for_log(f"child_exited: slot 2 pid {added} (exit code 0) after draining")
    wait_until(lambda: _gone(added), 10, what=f"child {added} gone")
    assert fleet.wait_ready(2)["status"] == "ok"

    fleet.send(signal.SIGTERM)
    assert fleet.wait() == 0


def test_sighup_replaces_every_child_one_at_a_time_with_the_new_code(
    fleets: Fleets, client: SyncWorkflowClient
) -> None:
    fleet = fleets.start("-n", "2", *QUICK)
    before = pids(fleet.wait_ready(2))
    assert client.result(client.submit("fa_version", {}).run_id, timeout=20) == "v1"

    # Twice: the fork server replaced by the first reload must not hold up the second.
    for round_, version in enumerate(("v2-reloaded", "v3-reloaded-again"), start=1):
        # New code on disk (another length, so no stale bytecode can stand in for it).
        app = fleets.directory / f"{APP_MODULE}.py"
        app.write_text(APP.replace('VERSION = "v1"', f'VERSION = "{version}"'))
        started = time.monotonic()
        with StatusRecorder(fleet) as recorder:
            fleet.send(signal.SIGHUP)
            after = fleet.wait_status(
                lambda s, old=before, n=round_: len(ready_children(s)) == 2
                and not set(pids(s).values()) & set(old.values())
                and all(c["restarts"] == n for c in s["children"]),
                what=f"every child replaced ({version})")
        print(f"SIGHUP: both children replaced in {time.monotonic() - started:.3f} s; "
              f"fewest ready children seen: {recorder.min_ready()}")
        assert set(pids(after)) == set(before)
        assert after["restarts"] == 2 * round_
        # Capacity kept: at most one child short at any moment (n - 1 = 1 ready at least).
        assert recorder.min_ready() >= 1

        for _ in range(4):
            run = client.submit("fa_version", {})
            assert client.result(run.run_id, timeout=20) == version
        for pid in before.values():
            wait_until(lambda pid=pid: _gone(pid), 10, what=f"old child {pid} gone")
        before = pids(after)
    assert "received SIGHUP: loading the code anew" in fleet.log()

    fleet.send(signal.SIGTERM)
    assert fleet.wait() == 0


def _with_run_in_flight(fleets: Fleets, client: SyncWorkflowClient,
                        tag: str) -> tuple[Fleet, str, dict[int, int]]:
    fleet = fleets.start("-n", "2", *QUICK)
    fleet.wait_ready(2)
    run = client.submit("fa_gated", {"tag": tag})
    status = fleet.wait_status(lambda s: sum(c["in_flight"] for c in s["children"]) == 1,
                               what="the run in flight")
    return fleet, run.run_id, pids(status)


def test_sigterm_drains_the_runs_in_flight_then_exits_0(
    fleets: Fleets, client: SyncWorkflowClient
) -> None:
    fleet, run_id, children = _with_run_in_flight(fleets, client, "t")
    assert fleet.get("/readyz")[0] == 200

    fleet.send(signal.SIGTERM)
    draining = fleet.wait_status(lambda s: s["status"] == "draining", what="draining")
    code, body = fleet.get("/readyz")
    assert code == 503 and json.loads(body)["status"] == "draining"
    assert fleet.get("/livez")[0] == 200
    # The run holds the drain: the fleet waits for it rather than quitting.
    assert fleet.proc.poll() is None
    assert client.get(run_id).status == RunStatus.RUNNING
    assert all(c["state"] == "draining" for c in draining["children"])

    fleets.open_gate("t")
    assert fleet.wait() == 0
    assert client.get(run_id).status == RunStatus.COMPLETED
    assert client.result(run_id, timeout=5) in children.values()
    log = fleet.log()
    assert "fleet_stopped" in log and log.count("worker_stopped") == 2
    for pid in children.values():
        wait_until(lambda pid=pid: _gone(pid), 10, what=f"child {pid} gone")


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_second_signal_while_draining_quits_at_once_and_requeues_the_runs(
    fleets: Fleets, client: SyncWorkflowClient, signum: signal.Signals, code: int
) -> None:
    # The run's async step blocks its child's event loop for 20 s (``time.sleep``): that
    # child cannot drain, so the fleet waits for it until the second signal.
    fleet = fleets.start("-n", "2", *QUICK)
    children = pids(fleet.wait_ready(2))
    run = client.submit("fa_hog", {"tag": "q", "seconds": 20})
    wait_until(lambda: fleets.ran("hog", "q"), 20, what="the step blocking its loop")
    fleet.send(signum)
    fleet.wait_status(lambda s: s["status"] == "draining", what="draining")
    assert fleet.proc.poll() is None

    sent = time.monotonic()
    fleet.send(signum)
    assert fleet.wait() == code
    took = time.monotonic() - sent
    assert took < 8, f"the fleet took {took:.1f} s to quit after the second signal"
    log = fleet.log()
    assert "quitting now" in log
    # Every child was killed and reaped before the fleet exited; the fork server and
    # multiprocessing's resource tracker end as soon as they see the supervisor gone.
    assert all(_gone(pid) for pid in children.values()), children
    wait_until(lambda: not group_alive(fleet.pid), 5, what="no process of the fleet left")
    # The killed attempt's run went back to the queue at once, not after an orphan scan.
    info = client.get(run.run_id)
    assert info.status == RunStatus.QUEUED, info
    journal = client.events(run.run_id)
    assert journal[-1]["type"] == "run:requeued", journal[-1]
    assert "runs_recovered" in log

    # The next fleet takes it straight from the queue and finishes it.
    fleets.open_gate("q")
    successor = fleets.start("-n", "1", *QUICK)
    assert client.result(run.run_id, timeout=20) == "hogged"
    assert fleets.ran("hog", "q")[-1] in pids(successor.wait_ready(1)).values()
    successor.send(signal.SIGTERM)
    assert successor.wait() == 0


def test_a_child_sent_sigterm_alone_drains_and_is_replaced(
    fleets: Fleets, client: SyncWorkflowClient
) -> None:
    fleet = fleets.start("-n", "2", *QUICK)
    before = pids(fleet.wait_ready(2))
    os.kill(before[1], signal.SIGTERM)
    after = fleet.wait_status(
        lambda s: pids(s).get(1) not in (None, before[1]) and len(ready_children(s)) == 2,
        what="slot 1 replaced")
    assert pids(after)[0] == before[0]
    assert [c["restarts"] for c in after["children"]] == [0, 1]
    log = fleet.log()
    assert f"child_exited: slot 1 pid {before[1]} (exit code 0) after draining on its own" in log
    assert "runs_recovered" not in log
    assert client.result(client.submit("fa_version", {}).run_id, timeout=20) == "v1"
    fleet.send(signal.SIGTERM)
    assert fleet.wait() == 0


def test_sigterm_to_the_whole_process_group_drains_the_fleet(
    fleets: Fleets, client: SyncWorkflowClient
) -> None:
    # As honcho, `docker stop` under an init, or systemd send it: supervisor, fork server
    # and children all get it. The fork server survives it; the children's exits count
    # as drained, not as deaths to recover or replace.
    fleet, run_id, children = _with_run_in_flight(fleets, client, "g")
    os.killpg(fleet.pid, signal.SIGTERM)
    fleet.wait_status(lambda s: s["status"] == "draining", what="draining")
    fleets.open_gate("g")
    assert fleet.wait() == 0
    assert client.get(run_id).status == RunStatus.COMPLETED
    log = fleet.log()
    assert log.count("after draining") == 2 and "died" not in log and "on its own" not in log
    for pid in children.values():
        wait_until(lambda pid=pid: _gone(pid), 10, what=f"child {pid} gone")


def test_a_child_killed_at_the_drain_deadline_has_its_runs_requeued(
    fleets: Fleets, client: SyncWorkflowClient
) -> None:
    # One SIGTERM (two sent together count as one: the kernel merges a pending signal). The
    # child whose loop is blocked cannot drain, so the fleet kills it at its drain deadline
    # (shutdown_grace + 3 x cancel_timeout + 5 s) and takes its run back at once.
    fleet = fleets.start("-n", "1", "--shutdown-grace", "0.5", "--cancel-timeout", "0.2")
    fleet.wait_ready(1)
    run = client.submit("fa_hog", {"tag": "d", "seconds": 20})
    wait_until(lambda: fleets.ran("hog", "d"), 20, what="the step blocking its loop")
    fleet.send(signal.SIGTERM)
    fleet.wait()
    assert "children still running past the drain deadline: killing them" in fleet.log()
    assert client.get(run.run_id).status == RunStatus.QUEUED
    assert client.events(run.run_id)[-1]["type"] == "run:requeued"


def test_a_second_signal_quits_at_once_even_when_the_store_does_not_answer(
    fleets: Fleets, tmp_path: Path
) -> None:
    # A server of the test's own, frozen (SIGSTOP) between the two signals: requeueing the
    # killed child's runs cannot complete, and the fleet exits anyway, saying so. The
    # runs stay with the orphan scan of whichever worker comes next.
    server = start_server(tmp_path)
    try:
        fleet = fleets.start("-n", "2", "--namespace", "frozen", *QUICK, store=server.url)
        children = pids(fleet.wait_ready(2))
        client = SyncWorkflowClient(ValkeyStore(url=server.url, namespace="frozen"))
        run = client.submit("fa_hog", {"tag": "f", "seconds": 20})
        wait_until(lambda: fleets.ran("hog", "f"), 20, what="the step blocking its loop")
        fleet.send(signal.SIGTERM)
        fleet.wait_status(lambda s: s["status"] == "draining" and len(s["children"]) == 1,
                          what="the idle child drained")
        assert server.pid is not None
        os.kill(server.pid, signal.SIGSTOP)
        try:
            sent = time.monotonic()
            fleet.send(signal.SIGTERM)
            assert fleet.wait() == 143
            took = time.monotonic() - sent
        finally:
            os.kill(server.pid, signal.SIGCONT)
        assert took < 8, f"the fleet took {took:.1f} s to quit after the second signal"
        assert all(_gone(pid) for pid in children.values()), children
        assert "the orphan scan will" in fleet.log()
        assert client.get(run.run_id).status == RunStatus.RUNNING
    finally:
        server.stop()
