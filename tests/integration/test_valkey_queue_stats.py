"""The Valkey store's queue_stats: one round trip for every shard of every name, on one
server and on a cluster, and the age of records an older build queued again (no
``queued_at``)."""

from __future__ import annotations

import uuid

import redis

from pyrula.workflows import ValkeyStore
from pyrula.workflows.stores.capabilities import QueueStat
from tests.servers import Cluster, Server

NAME = "vk.queue_stats"
OTHER = "vk.queue_stats.other"
T0 = 1_800_000_000.0


async def _fill(store: ValkeyStore) -> None:
    for i in range(40):
        await store.submit(NAME, None, now=T0 + i, owner=f"tenant-{i % 3}")
    await store.submit(OTHER, None, now=T0 + 100)


async def test_every_shard_is_read_in_one_round_trip(valkey_server: Server) -> None:
    store = ValkeyStore(url=valkey_server.url, namespace=f"t{uuid.uuid4().hex[:16]}",
                        shard_count=16)
    try:
        await _fill(store)
        before = store.connection.stats["round_trips"]

        stats = await store.queue_stats([NAME, OTHER, "vk.never"])

        assert store.connection.stats["round_trips"] - before == 1
        assert stats == {NAME: QueueStat(40, T0), OTHER: QueueStat(1, T0 + 100),
                         "vk.never": QueueStat(0, None)}
    finally:
        store.close()


async def test_a_cluster_answers_in_one_round_trip_per_node(valkey_cluster: Cluster) -> None:
    store = ValkeyStore(url=valkey_cluster.url, namespace=f"t{uuid.uuid4().hex[:16]}",
                        shard_count=16)
    try:
        await _fill(store)
        before = store.connection.stats["round_trips"]

        stats = await store.queue_stats([NAME, OTHER])

        # One batch: the router sends each node its shards' calls, all nodes at once.
        assert store.connection.stats["round_trips"] - before == 1
        assert stats == {NAME: QueueStat(40, T0), OTHER: QueueStat(1, T0 + 100)}
    finally:
        store.close()


async def test_a_record_queued_again_by_an_older_build_is_dated_by_its_last_write(
    valkey_server: Server,
) -> None:
    store = ValkeyStore(url=valkey_server.url, namespace=f"t{uuid.uuid4().hex[:16]}",
                        shard_count=1)
    try:
        handle, _ = await store.submit(NAME, None, now=T0)
        claimed = await store.claim_run(handle.run_id, "w", now=T0 + 1, lock_ttl=30.0)
        assert claimed is not None
        await store.requeue(handle.run_id, claimed.token, now=T0 + 10, reason="shutdown")
        with redis.Redis.from_url(valkey_server.url) as plain:
            assert plain.hdel(store.keys.run(handle.run_id), "queued_at") == 1

        assert await store.queue_stats([NAME]) == {NAME: QueueStat(1, T0 + 10)}
    finally:
        store.close()
