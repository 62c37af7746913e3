"""A planned failover of every primary of a Valkey cluster, under load, fails no run and
restarts no child: the store follows the cluster (MOVED, a role change that unblocks a
blocking read, a slot map read again) instead of failing the calls caught in it.

A private 3-primary / 3-replica cluster; ``CLUSTER FAILOVER`` sent to each original replica
in turn while a client keeps submitting three-step runs to a ``pyrula-fleet -n 2``.
"""

from __future__ import annotations

import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

from pyrula.workflows import RunStatus, SyncWorkflowClient, ValkeyStore
from tests.conftest import wait_until
from tests.fleet.fleetprocs import QUICK, Fleets, write_app
from tests.servers import Cluster, Server, start_cluster

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

APP = textwrap.dedent(
    '''
    import asyncio
    from pyrula.workflows import step, workflow

    @step(name="fo.add")
    async def add(x: int) -> int:
        await asyncio.sleep(0.005)
        return x + 1

    @workflow(name="fo.three")
    async def three(ctx, params):
        x = params["x"]
        for _ in range(3):
            x = await add(x)
        return x
    '''
)


def _role(node: Server) -> str:
    with node.client(socket_timeout=2, decode_responses=True) as client:
        return str(client.info("replication")["role"])


def _fail_over(cluster: Cluster, replica: Server) -> None:
    with replica.client(decode_responses=True) as client:
        client.execute_command("CLUSTER", "FAILOVER")
    wait_until(lambda: _role(replica) == "master", 20, what=f"{replica.url} promoted")
    cluster.wait_healthy()


def test_failover_of_every_primary_under_load(tmp_path: Path) -> None:
    cluster = start_cluster(tmp_path / "cluster", primaries=3, replicas_per_primary=1)
    fleets = Fleets(tmp_path)
    write_app(tmp_path, APP, module="foapp")
    store = ValkeyStore(url=cluster.url, namespace="failover", shard_count=64)
    client = SyncWorkflowClient(store)
    submitted: list[tuple[str, int]] = []
    stop = threading.Event()
    errors: list[BaseException] = []

    def keep_submitting() -> None:
        x = 0
        while not stop.is_set():
            try:
                submitted.append((client.submit("fo.three", {"x": x}).run_id, x))
            except BaseException as exc:  # reported by the test below
                errors.append(exc)
                return
            x += 1
            stop.wait(0.002)

    try:
        fleet = fleets.start("-n", "2", "--app", "foapp", "--namespace", "failover",
                             *QUICK, app=None, store=cluster.url)
        fleet.wait_ready(2, timeout=30)
        submitter = threading.Thread(target=keep_submitting, name="submitter")
        submitter.start()
        try:
            wait_until(lambda: errors or len(submitted) >= 200, 30, what="a first load")
            assert not errors, errors
            for replica in cluster.replicas():
                _fail_over(cluster, replica)
                mark = len(submitted)
                wait_until(lambda m=mark: len(submitted) >= m + 100, 30,  # type: ignore[misc]
                           what="submits going on after the failover")
        finally:
            stop.set()
            submitter.join(30)
        assert not errors, errors
        assert len(submitted) >= 500

        def ended() -> list[Any] | None:
            infos = [client.get(run_id) for run_id, _ in submitted]
            return infos if all(i.status.terminal for i in infos) else None

        infos = wait_until(ended, 120, interval=0.2, what="every run ended")
        failed = [(i.run_id, i.status, i.error) for i in infos
                  if i.status is not RunStatus.COMPLETED]
        assert failed == [], failed[:5]
        assert [i.result for i in infos] == [x + 3 for _, x in submitted]
        status = fleet.status()
        assert status is not None
        assert status["restarts"] == 0, fleet.log()[-4000:]
        assert len([c for c in status["children"] if c["state"] == "ready"]) == 2
    finally:
        stop.set()
        fleets.reap()
        store.close()
        cluster.kill()
