"""Fleets on one Valkey namespace share its shards: ownership converges to within one of
shard_count / N (N = every live child of every fleet) after a join, a leave or a crash.

The suite's own Valkey server (``valkey_url``), a namespace per test; 64 shards of the one
workflow served (``fa_load``).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

from pyrula.workflows import SyncWorkflowClient, ValkeyStore
from tests.fleet.fleetprocs import QUICK, Fleet, Fleets, StatusRecorder
from tests.servers import start_server

SHARDS = 64
NAME = "fa_load"


def _start(fleets: Fleets, url: str, namespace: str, *options: str) -> Fleet:
    return fleets.start("-n", "2", "--workflow", "fleetapp:load", "--namespace", namespace,
                        "--shard-lease-interval", "0.5", *options, *QUICK, app=None, store=url)


def _held(status: dict[str, Any]) -> list[int]:
    return [c["shards"].get(NAME, 0) for c in status["children"] if c["state"] == "ready"]


def _balanced(statuses: list[dict[str, Any]], children: int) -> bool:
    """Every shard held once, by ``children`` ready children, each within one of its share."""
    held = [n for status in statuses for n in _held(status)]
    share = SHARDS / children
    return len(held) == children and sum(held) == SHARDS and all(
        abs(n - share) <= 1 for n in held)


def _wait_balanced(fleets_: list[Fleet], children: int, what: str,
                   timeout: float = 20.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        statuses = [f.wait_status(lambda s: True, what="an answer") for f in fleets_]
        if _balanced(statuses, children):
            return statuses
        assert time.monotonic() < deadline, f"not balanced ({what}): {statuses}"
        time.sleep(0.05)


def test_two_fleets_share_the_shards_and_one_takes_them_all_when_the_other_stops(
    fleets: Fleets, valkey_url: str, valkey_namespace: str
) -> None:
    a = _start(fleets, valkey_url, valkey_namespace, "--shard-lease-ttl", "2")
    a.wait_ready(2)
    _wait_balanced([a], 2, "fleet A alone")

    b = _start(fleets, valkey_url, valkey_namespace, "--shard-lease-ttl", "2")
    b.wait_ready(2)
    joined = time.monotonic()
    statuses = _wait_balanced([a, b], 4, "A and B")
    print(f"valkey: 4 children balanced {time.monotonic() - joined:.3f} s after B was ready")
    for status in statuses:  # about half each
        assert abs(status["shards"][NAME] - SHARDS / 2) <= 2

    b.send(signal.SIGTERM)
    assert b.wait() == 0  # its children released their shards on the way out
    left = time.monotonic()
    statuses = _wait_balanced([a], 2, "A after B left")
    print(f"valkey: A holds all {SHARDS} shards {time.monotonic() - left:.3f} s after B left")
    assert statuses[0]["shards"] == {NAME: SHARDS}

    a.send(signal.SIGTERM)
    assert a.wait() == 0


def test_the_shards_of_a_killed_child_are_released_at_once_and_its_runs_finish(
    fleets: Fleets, valkey_url: str, valkey_namespace: str
) -> None:
    # Leases lapse only after 60 s here: rebalancing sooner than that needs the supervisor
    # to release the dead child's shards itself. (A short lock_ttl is the backstop for a run
    # claimed in the instant of the kill, before the child could report it.)
    fleet = _start(fleets, valkey_url, valkey_namespace, "--shard-lease-ttl", "60",
                   "--lock-ttl", "3", "--orphan-scan-interval", "1")
    fleet.wait_ready(2)
    before = _wait_balanced([fleet], 2, "before the kill")[0]
    store = ValkeyStore(url=valkey_url, namespace=valkey_namespace)
    try:
        client = SyncWorkflowClient(store)
        runs = [client.submit(NAME, {"tag": f"v{i}"}) for i in range(40)]
        busy = fleet.wait_status(lambda s: any(c["in_flight"] > 0 for c in s["children"]),
                                 what="runs in flight")
        victim = max(busy["children"], key=lambda c: c["in_flight"])
        killed = time.monotonic()
        os.kill(victim["pid"], signal.SIGKILL)
        fleet.wait_status(
            lambda s: any(c["slot"] == victim["slot"] and c["pid"] != victim["pid"]
                          for c in s["children"]), what="the replacement")
        after = _wait_balanced([fleet], 2, "after the kill", timeout=20)[0]
        print(f"valkey: shards rebalanced {time.monotonic() - killed:.3f} s after kill -9 "
              "(lease ttl 60 s)")
        assert {c["pid"] for c in after["children"]} != {c["pid"] for c in before["children"]}
        for run in runs:
            assert client.result(run.run_id, timeout=30) == ["a", "b"]
        assert f"runs of dead child {victim['worker_id']} requeued" in fleet.log()
    finally:
        store.close()
    fleet.send(signal.SIGTERM)
    assert fleet.wait() == 0


def test_after_an_upgrade_the_fleet_is_not_ok_until_its_new_child_holds_shards(
    fleets: Fleets, valkey_url: str, valkey_namespace: str
) -> None:
    # The shard lease loop's own interval (10 s, the default): the new child must not
    # wait for it once the old child has released the shards.
    fleet = fleets.start("-n", "1", "--workflow", "fleetapp:load", "--namespace",
                         valkey_namespace, "--shard-lease-interval", "10", *QUICK,
                         app=None, store=valkey_url)
    fleet.wait_status(lambda s: s["status"] == "ok" and _held(s) == [SHARDS], 20,
                      what="one child holding every shard")
    with StatusRecorder(fleet) as recorder:
        fleet.send(signal.SIGUSR2)
        fleet.wait_status(lambda s: "generations" in s, 20, what="the upgrade under way")
        fleet.wait_status(lambda s: "generations" not in s, 30, what="the old child gone")
        gone = time.monotonic()
        fleet.wait_status(lambda s: s["status"] == "ok" and _held(s) == [SHARDS], 5,
                          what="the new child holding every shard")
        print(f"valkey: the new child held every shard {time.monotonic() - gone:.3f} s "
              "after the old one left (shard lease interval 10 s)")
    for sample in recorder.samples:
        if sample["status"] == "ok":
            assert sum(_held(sample)) > 0, sample  # never "ok" while holding none
    assert any(s["status"] == "starting" and s.get("unleased") == [NAME]
               for s in recorder.samples), "the new child was never seen holding none"
    fleet.send(signal.SIGTERM)
    assert fleet.wait() == 0


def test_the_runs_of_a_child_killed_while_the_store_is_down_are_requeued_once_it_answers(
    fleets: Fleets, tmp_path: Path
) -> None:
    # Locks and leases lapse only after 60 s here: the runs finish sooner only if the
    # supervisor, which saw the child die, requeues them itself once the store is back.
    server = start_server(tmp_path / "valkey", appendonly="yes", appendfsync="always")
    store = ValkeyStore(url=server.url, namespace="downed")
    try:
        fleet = fleets.start("-n", "2", "--namespace", "downed", "--lock-ttl", "60",
                             "--shard-lease-ttl", "60", "--orphan-scan-interval", "1", *QUICK,
                             store=server.url)
        fleet.wait_ready(2)
        client = SyncWorkflowClient(store)
        runs = {f"d{i}": client.submit("fa_gated", {"tag": f"d{i}"}) for i in range(4)}
        busy = fleet.wait_status(lambda s: sum(c["in_flight"] for c in s["children"]) == 4,
                                 what="4 runs in flight")
        victim = max(busy["children"], key=lambda c: c["in_flight"])
        server.kill()
        os.kill(victim["pid"], signal.SIGKILL)
        fleet.wait_for_log(f"could not requeue the runs of dead child {victim['worker_id']}")
        server.launch(keep_port=True)
        server.wait_ready()
        for tag in runs:
            fleets.open_gate(tag)
        for run in runs.values():
            assert isinstance(client.result(run.run_id, timeout=30), int)
        log = fleet.log()
        assert f"runs of dead child {victim['worker_id']} requeued" in log
        assert "run_reclaimed" not in log  # not the orphan scan's doing
        moved = [run for run in runs.values() if client.get(run.run_id).attempt == 2]
        assert len(moved) == victim["in_flight"]
        fleet.send(signal.SIGTERM)
        assert fleet.wait() == 0
    finally:
        store.close()
        server.kill()


def test_the_shards_of_a_child_that_drained_while_the_store_was_down_are_released_after(
    fleets: Fleets, tmp_path: Path
) -> None:
    # The child cannot release its shards on its way out, and they lapse only after 60 s:
    # its replacement gets them sooner only if the supervisor releases them for it.
    server = start_server(tmp_path / "valkey", appendonly="yes", appendfsync="always")
    try:
        fleet = _start(fleets, server.url, "drained", "--shard-lease-ttl", "60")
        fleet.wait_ready(2)
        before = _wait_balanced([fleet], 2, "before the outage")[0]
        leaving = before["children"][0]
        server.kill()
        os.kill(leaving["pid"], signal.SIGTERM)
        fleet.wait_for_log(f"pid {leaving['pid']} (exit code 0) after draining on its own")
        server.launch(keep_port=True)
        server.wait_ready()
        after = _wait_balanced([fleet], 2, "after the store came back", timeout=20)[0]
        assert leaving["pid"] not in {c["pid"] for c in after["children"]}
        assert f"could not release the shards of {leaving['worker_id']} yet" in fleet.log()
        fleet.send(signal.SIGTERM)
        assert fleet.wait() == 0
    finally:
        server.kill()
