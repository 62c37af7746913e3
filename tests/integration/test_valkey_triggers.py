"""Batch triggers on Valkey beyond the store contract: a copy of the topic's log repeated
(a take retried after its reply was lost, or two workers copying the same events) copies
nothing twice (only what is past the workflow's copy mark); the log is pruned once every
subscription copied it, its emit keys then kept for ``completed_ttl``; and a server killed
and restarted (AOF, fsync always) under a worker emitting and taking loses no event and
doubles none."""

from __future__ import annotations

import asyncio
from typing import Any

from pyrula.workflows import (
    BatchTrigger,
    RunStatus,
    ValkeyStore,
    WorkflowClient,
    WorkflowContext,
    workflow,
)
from tests.conftest import await_until
from tests.integration.valkey_support import make_worker, opened, serving

T0 = 1_800_000_000.0
TOPIC = "vt.topic"


@workflow(name="vt.batch", trigger=BatchTrigger(TOPIC, max_size=5, max_wait=0.2))
async def batch(ctx: WorkflowContext, params: Any) -> Any:
    return [event["id"] for event in params["events"]]


async def _route_and_take_twice(store: ValkeyStore, name: str) -> list[str]:
    """One route, then its take sent twice (a retry): the run ids the two started."""
    t = store.triggers
    conn = store.connection
    start, rows = await conn.op(conn.keys.topic(TOPIC), "trigger_route", name, "", 1000, 60)
    end = int(float(rows[-1]))
    shard = t.trigger_shard(TOPIC)
    from pyrula.workflows.stores.valkey.keys import name_hash
    from pyrula.workflows.stores.valkey.triggers import params_prefix

    args = ("trigger_take", name, name_hash(TOPIC), TOPIC, int(start), end, 2, "3600.0",
            repr(T0), 100, f"{name_hash(name)}{shard:04x}", params_prefix(TOPIC), *rows)
    base = conn.keys.base_of(name, shard)
    first = await conn.op(base, *args)
    again = await conn.op(base, *args)
    return [str(r) for r in first[2:]] + [str(r) for r in again[2:]]


async def test_a_repeated_copy_of_the_log_copies_nothing_twice(valkey_url: str,
                                                     valkey_namespace: str) -> None:
    store = ValkeyStore(url=valkey_url, namespace=valkey_namespace, shard_count=4)
    async with opened(store):
        client = WorkflowClient(store)
        ids = [await client.emit(TOPIC, i) for i in range(4)]
        runs = await _route_and_take_twice(store, "vt.batch")
        assert len(runs) == 2  # two batches of two, from the first copy only
        taken = [e["id"] for r in runs for e in (await client.get(r)).params["events"]]
        assert taken == ids
        left = await store.take_batches("vt.batch", TOPIC, max_size=2, max_wait=1.0,
                                        now=T0 + 10, limit=10)
        assert left == []


async def test_the_log_is_pruned_once_copied_and_keys_then_expire(
        valkey_url: str, valkey_namespace: str) -> None:
    store = ValkeyStore(url=valkey_url, namespace=valkey_namespace, shard_count=1,
                        completed_ttl=100)
    async with opened(store):
        client = WorkflowClient(store)
        await store.take_batches("vt.batch", TOPIC, max_size=1, max_wait=1.0, now=T0, limit=1)
        await client.emit(TOPIC, 1, key="k-1")
        for _ in range(2):  # the second take confirms the first one's copy
            await store.take_batches("vt.batch", TOPIC, max_size=1, max_wait=1.0, now=T0,
                                     limit=10)
        conn, base = store.connection, store.connection.keys.topic(TOPIC)
        assert await conn.read(base, "ZCARD", f"{base}:log") == 0
        assert 0 < await conn.read(base, "TTL", f"{base}:key:k-1") <= 100


async def test_a_server_restart_under_load_loses_no_event(valkey_server_factory: Any) -> None:
    server = valkey_server_factory(appendonly="yes", appendfsync="always")
    store = ValkeyStore(url=server.url, namespace="vt", shard_count=4, socket_timeout=2.0)
    emitter = ValkeyStore(url=server.url, namespace="vt", shard_count=4, socket_timeout=2.0)
    async with opened(store, emitter):
        worker = make_worker(store, [batch], trigger_interval=0.02, lock_ttl=5.0)
        client = WorkflowClient(emitter)
        emitted: list[str] = []

        async def emit(n: int) -> None:
            for i in range(n):
                emitted.append(await client.emit(TOPIC, i))
                await asyncio.sleep(0.002)

        async with serving(worker):
            await emit(40)
            server.kill()
            server.restart()
            await await_until(_answers(emitter), timeout=20, what="the server back")
            await emit(40)
            await await_until(lambda: _all_taken(client, emitted), timeout=60,
                              what="every event in a completed run")
        seen = await _taken(client)
        assert sorted(seen) == sorted(emitted)


def _answers(store: ValkeyStore) -> Any:
    async def check() -> bool:
        try:
            await store.aping()
        except Exception:
            return False
        return True

    return check


async def _taken(client: WorkflowClient) -> list[str]:
    runs = [r async for r in client.list_runs(name="vt.batch")]
    return [e["id"] for r in runs for e in r.params["events"]]


async def _all_taken(client: WorkflowClient, emitted: list[str]) -> bool:
    runs = [r async for r in client.list_runs(name="vt.batch")]
    if any(r.status is not RunStatus.COMPLETED for r in runs):
        return False
    return set(await _taken(client)) >= set(emitted)
