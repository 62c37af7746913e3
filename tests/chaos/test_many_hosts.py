"""Two fleets as two hosts over one Valkey cluster (3 primaries): each fleet in its own
process group, with its own health port and worker ids, all on 127.0.0.1.

* Shards converge to within one of 64 / N (N = every live worker of both fleets) within
  2 x ``shard_lease_interval`` after a fleet joins and after one leaves (measured, printed).
* A primary failover (``CLUSTER FAILOVER`` on a replica) in the middle of a load spread over
  both fleets fails no run and restarts no child (verdict clean).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from pyrula.wire import HEARTBEAT_INTERVAL
from pyrula.workflows import SyncWorkflowClient, ValkeyStore
from tests.chaos.harness import APP, WORKFLOW, ChaosLoad
from tests.conftest import wait_until
from tests.fleet.fleetprocs import QUICK, Fleet, Fleets, ready
from tests.servers import Cluster, Server, start_cluster

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

SHARDS = 64
INTERVAL = 1.0  # --shard-lease-interval
BOUND = 2 * INTERVAL
#: What the measurement adds to the store's own convergence: /status shows the shards a
#: child held at its last heartbeat (HEARTBEAT_INTERVAL, 0.25 s, old at most), and both
#: hosts' /status are polled in turn (every 0.05 s, each a few ms on a loaded machine).
SEEN_LATE = HEARTBEAT_INTERVAL + 0.25
LEASE_TTL = 3.0  # --shard-lease-ttl: how long a dead host's shards stay leased


def _host(fleets: Fleets, name: str, url: str, namespace: str, children: int = 2) -> Fleet:
    """One "host": a fleet of its own process group, health port and worker ids."""
    return fleets.start("-n", str(children), "--namespace", namespace,
                        "--shard-lease-interval", str(INTERVAL), "--shard-lease-ttl",
                        str(LEASE_TTL), *QUICK, app=APP, store=url, name=name)


def _shares(statuses: list[dict[str, Any]]) -> list[int]:
    return [c["shards"].get(WORKFLOW, 0) for s in statuses for c in ready(s)]


def _balanced(statuses: list[dict[str, Any]], workers: int) -> bool:
    """Every shard held once, by ``workers`` ready children, each within one of its share."""
    held = _shares(statuses)
    return len(held) == workers and sum(held) == SHARDS and all(
        abs(n - SHARDS / workers) <= 1 for n in held)


def _converge(hosts: list[Fleet], workers: int, since: float, what: str) -> float:
    """Seconds from ``since`` until the hosts' /status shows the shards balanced."""
    last: list[list[dict[str, Any]]] = [[]]

    def balanced() -> bool:
        last[0] = [h.wait_status(lambda s: True, what="an answer") for h in hosts]
        return _balanced(last[0], workers)

    try:
        wait_until(balanced, 30, interval=0.02, what=what)
    except AssertionError:
        raise AssertionError(f"not balanced ({what}): {_shares(last[0])}") from None
    took = time.monotonic() - since
    print(f"shards over {workers} workers of {len(hosts)} hosts balanced "
          f"({sorted(_shares(last[0]))}) {took:.2f} s {what}")
    return took


def test_shards_converge_within_two_lease_intervals_as_hosts_join_and_leave(
    fleets: Fleets, valkey_cluster: Cluster, valkey_namespace: str
) -> None:
    url = valkey_cluster.url
    a = _host(fleets, "host-a", url, valkey_namespace)
    a.wait_ready(2, timeout=60)
    _converge([a], 2, time.monotonic(), "host A alone")

    b = _host(fleets, "host-b", url, valkey_namespace)
    b.wait_ready(2, timeout=60)
    joined = time.monotonic()
    took_join = _converge([a, b], 4, joined, "after host B joined")
    ids = [c["worker_id"] for h in (a, b) for c in h.wait_status(lambda s: True)["children"]]
    assert len(set(ids)) == 4
    assert a.port != b.port

    b.send(signal.SIGTERM)
    assert b.wait(30) == 0  # its children released their shards on the way out
    left = time.monotonic()
    took_leave = _converge([a], 2, left, "after host B left")
    assert took_join <= BOUND + SEEN_LATE, (
        f"{took_join:.2f} s to converge after a join (bound {BOUND} s, seen via /status)")
    assert took_leave <= BOUND + SEEN_LATE, (
        f"{took_leave:.2f} s to converge after a leave (bound {BOUND} s, seen via /status)")

    # A host that dies releases nothing: its shards lapse after shard_lease_ttl, and the
    # live workers take them on their next lease ticks.
    c = _host(fleets, "host-c", url, valkey_namespace)
    c.wait_ready(2, timeout=60)
    _converge([a, c], 4, time.monotonic(), "after host C joined")
    os.killpg(c.pid, signal.SIGKILL)
    died = time.monotonic()
    c.wait(30)
    took_death = _converge([a], 2, died, "after host C died (kill -9 of its process group)")
    assert took_death <= LEASE_TTL + BOUND + SEEN_LATE
    a.send(signal.SIGTERM)
    assert a.wait(30) == 0


def _role(node: Server) -> str:
    with node.client(socket_timeout=2, decode_responses=True) as client:
        return str(client.info("replication")["role"])


def test_a_primary_failover_mid_load_across_two_hosts_fails_nothing(
    tmp_path: Path, fleets: Fleets
) -> None:
    cluster = start_cluster(tmp_path / "cluster", primaries=3, replicas_per_primary=1)
    store = ValkeyStore(url=cluster.url, namespace="hosts", shard_count=SHARDS)
    try:
        load = ChaosLoad(SyncWorkflowClient(store), tmp_path, steps=3, hold=0.01, seed=51)
        a = _host(fleets, "host-a", cluster.url, "hosts", children=1)
        b = _host(fleets, "host-b", cluster.url, "hosts", children=1)
        a.wait_ready(1, timeout=60)
        b.wait_ready(1, timeout=60)
        load.submit(150)
        replica = cluster.replicas()[0]
        state = {"failed_over": False, "after": 0}

        def nemesis() -> bool:
            if not state["failed_over"]:
                if load.done() >= 50:  # mid-load: runs queued, running and done
                    with replica.client(decode_responses=True) as client:
                        client.execute_command("CLUSTER", "FAILOVER")
                    load.fault("CLUSTER FAILOVER", replica.port)
                    state["failed_over"] = True
                return True
            if _role(replica) != "master":
                return True
            if state["after"] < 2:  # keep loading both hosts after the promotion
                state["after"] += 1
                load.submit(100)
                return True
            return False

        load.wait_all(timeout=120, during=nemesis)
        assert _role(replica) == "master"
        logs = [a.log(), b.log()]
        report = load.verdict(store, logs)
        load.assert_holds(report)
        for host, log in zip((a, b), logs, strict=True):
            status = host.wait_ready(1, timeout=30)
            assert status["restarts"] == 0, log[-4000:]
            assert status["children"][0]["runs_done"] > 0  # both hosts carried the load
        for host in (a, b):
            host.send(signal.SIGTERM)
            assert host.wait(30) == 0
    finally:
        store.close()
        cluster.kill()
