"""Shard leases: workers serving a name share its 64 shards (shard_count / N each), hand
them back when they stop, and a worker killed without handing them back loses them once
its leases lapse (shard_lease_ttl). ``/readyz`` lists the shards a worker holds."""

from __future__ import annotations

import asyncio
import re
import signal
import textwrap
import time
from pathlib import Path
from typing import Any

import redis

from pyrula.dashboard.data import DashboardData
from pyrula.workflows import ValkeyStore, WorkflowWorker
from tests.conftest import await_until
from tests.integration.valkey_support import make_worker, noop, opened, serving
from tests.integration.workerprocs import WorkerProcess, child_env, free_port, http_get

NAME = "vk.noop"
LEASE = {"shard_lease_interval": 0.2, "shard_lease_ttl": 1.0}


def _leases(url: str, store: ValkeyStore) -> dict[int, str]:
    """The server's lease table of NAME: shard -> holding worker."""
    with redis.Redis.from_url(url, decode_responses=True) as client:
        table = client.hgetall(f"{store.keys.leases(NAME)}:leases")
    return {int(shard): value.split("|", 1)[0] for shard, value in table.items()}


async def _readyz(worker: WorkflowWorker) -> dict[str, Any]:
    assert worker.health_address is not None
    host, port = worker.health_address
    status, body = await asyncio.to_thread(http_get, f"http://{host}:{port}/readyz")
    assert status == 200, body
    return body


def _holds(worker: WorkflowWorker, count: int) -> bool:
    return worker.shards().get(NAME) == count


async def test_two_workers_split_the_shards_and_one_takes_all_back_when_the_other_stops(
    valkey_url: str, valkey_namespace: str
) -> None:
    stores = [ValkeyStore(url=valkey_url, namespace=valkey_namespace) for _ in range(2)]
    async with opened(*stores):
        first = make_worker(stores[0], [noop], health_port=0, **LEASE)
        second = make_worker(stores[1], [noop], **LEASE)
        async with serving(first):
            await await_until(lambda: _holds(first, 64), what="the first worker to hold 64")
            assert (await _readyz(first))["shards"] == {NAME: 64}
            assert set(_leases(valkey_url, stores[0]).values()) == {first.worker_id}

            async with serving(second):
                await await_until(lambda: _holds(first, 32) and _holds(second, 32),
                                  what="32 shards each")
                assert (await _readyz(first))["shards"] == {NAME: 32}
                table = _leases(valkey_url, stores[0])
                assert sorted(table) == list(range(64))  # each shard held by one of them
                assert sorted(table.values()).count(first.worker_id) == 32
                assert sorted(table.values()).count(second.worker_id) == 32

            # stop() released the second worker's shards; the first takes them all.
            assert second.worker_id not in _leases(valkey_url, stores[0]).values()
            await await_until(lambda: _holds(first, 64), what="the first to hold 64 again")
            assert (await _readyz(first))["shards"] == {NAME: 64}
            assert set(_leases(valkey_url, stores[0]).values()) == {first.worker_id}


APP = textwrap.dedent(
    '''
    from pyrula.workflows import workflow


    @workflow(name="vk.noop")
    async def noop(ctx, params):
        return params["tag"]
    '''
)


async def test_a_killed_workers_shards_are_leased_again_after_the_ttl(
    valkey_url: str, valkey_namespace: str, tmp_path: Path
) -> None:
    (tmp_path / "vkapp.py").write_text(APP)
    store = ValkeyStore(url=valkey_url, namespace=valkey_namespace)
    port = free_port()
    child = WorkerProcess(tmp_path, "killed", [
        "worker", "--app", "vkapp", "--store", valkey_url, "--namespace", valkey_namespace,
        "--shard-lease-interval", "0.2", "--shard-lease-ttl", "3", "--health-port", str(port),
        "--no-cloud",
    ], child_env(PYTHONPATH=f"{tmp_path}:{child_env()['PYTHONPATH']}"))
    try:
        async with opened(store):
            worker = make_worker(store, [noop], **LEASE)
            async with serving(worker):
                await await_until(lambda: _holds(worker, 32), timeout=20,
                                  what="the worker to share with the process")

                def child_holds_32() -> bool:
                    try:
                        status, body = http_get(f"http://127.0.0.1:{port}/readyz")
                    except OSError:
                        return False
                    return status == 200 and body["shards"] == {NAME: 32}

                await await_until(lambda: asyncio.to_thread(child_holds_32),
                                  what="the process's /readyz to show 32 shards")
                child.send(signal.SIGKILL)
                assert child.wait() == -signal.SIGKILL
                # Nothing was released: its 32 leases stand until they lapse.
                table = _leases(valkey_url, store)
                assert sorted(table.values()).count(worker.worker_id) == 32
                assert len(table) == 64

                await await_until(lambda: _holds(worker, 64), timeout=15,
                                  what="the survivor to lease the killed worker's shards")
                assert set(_leases(valkey_url, store).values()) == {worker.worker_id}
                run = await worker.client.submit(noop, {"tag": "after"})
                assert await worker.client.result(run.run_id, timeout=10) == "after"
    finally:
        child.reap()


async def test_the_shard_map_lists_every_live_worker_and_the_shards_it_leases(
    valkey_url: str, valkey_namespace: str
) -> None:
    # What the dashboard's shard map shows: read through a third store object, as the
    # fleet's supervisor reads it, not through the ones the workers lease with.
    stores = [ValkeyStore(url=valkey_url, namespace=valkey_namespace) for _ in range(3)]
    async with opened(*stores):
        first = make_worker(stores[0], [noop], **LEASE)
        second = make_worker(stores[1], [noop], **LEASE)
        async with serving(first), serving(second):
            await await_until(lambda: _holds(first, 32) and _holds(second, 32),
                              what="32 shards each")
            found = await stores[2].shard_map(now=time.time())
            assert {w["worker_id"] for w in found["workers"]} == {first.worker_id,
                                                                 second.worker_id}
            assert all(NAME in w["names"] for w in found["workers"])
            held = found["names"][NAME]["held"]
            assert {w: len(s) for w, s in held.items()} == {first.worker_id: 32,
                                                             second.worker_id: 32}
            assert sorted(held[first.worker_id] + held[second.worker_id]) == list(range(64))
            assert found["names"][NAME]["shards"] == 64
            assert found["names"][NAME]["unleased"] == 0
            # The dashboard shows the same map, its instants in ISO-8601 UTC.
            shown = await DashboardData(stores[2]).shards()
            assert all(re.fullmatch(r"\S+T\S+\.\d{3}Z", w["expires"]) for w in shown["workers"])
