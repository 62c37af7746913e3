"""ValkeyStore on a real 3-primary cluster: detected from any node's INFO, every operation
on one slot, runs spread over every primary; forced standalone, the first redirect names
the flag. (The store conformance suite runs on this cluster too: the ``store`` fixture.)"""

from __future__ import annotations

import time

import pytest
from redis.cluster import RedisCluster
from redis.crc import key_slot

from pyrula.workflows import ConfigurationError, RunStatus, ValkeyStore
from pyrula.workflows.records import PoisonPolicy
from pyrula.workflows.stores.valkey.keys import KeySpace, name_hash
from tests.integration.valkey_support import (
    LEDGER,
    all_ended,
    make_worker,
    one_step,
    opened,
    serving,
    statuses,
)
from tests.servers import Cluster

NAME = "vk.one_step"


class Slots:
    """Which node serves a key, and which node the store's URL names."""

    def __init__(self, cluster: Cluster) -> None:
        with RedisCluster.from_url(cluster.url) as client:
            cache = client.nodes_manager.slots_cache
            self._nodes = {slot: int(nodes[0].port) for slot, nodes in cache.items()}
        self.here = cluster.nodes[0].port

    def port(self, key: str) -> int:
        return self._nodes[key_slot(key.encode())]

    def is_here(self, *keys: str) -> bool:
        return all(self.port(k) == self.here for k in keys)

    def namespace(self, base: str, *, here: bool) -> str:
        """A namespace whose meta record and doorbell of NAME are (not) on the URL's node."""
        for i in range(1000):
            space = KeySpace(f"{base}m{i}")
            if self.is_here(space.meta, space.ready(NAME)) == here and (
                here or self.port(space.meta) != self.here
            ):
                return space.ns
        raise AssertionError("no such namespace")


async def test_a_cluster_is_detected_and_runs_complete_on_every_primary(
    valkey_cluster: Cluster, valkey_namespace: str
) -> None:
    LEDGER.clear()
    store = ValkeyStore(url=valkey_cluster.url, namespace=valkey_namespace)  # cluster=None
    async with opened(store):
        worker = make_worker(store, [one_step], max_concurrent_runs=30)
        async with serving(worker):
            assert store.connection.is_cluster is True
            runs = [(await worker.client.submit(one_step, {"tag": f"{valkey_namespace}-{i}"},
                                                owner=f"o{i % 3}")).run_id
                    for i in range(150)]
            await all_ended(store, runs)
            assert worker.shards() == {NAME: 64}
        assert await statuses(store, runs) == {RunStatus.COMPLETED: 150}
    for i in range(150):
        assert LEDGER.count("vk.touch", f"{valkey_namespace}-{i}") == 1
    # The runs' keys live on every primary (their shards spread over the slots).
    holders = {}
    for node in valkey_cluster.primaries():
        with node.client(decode_responses=True) as client:
            holders[node.port] = sum(
                1 for _ in client.scan_iter(match=f"{valkey_namespace}:*:run:*", count=1000))
    assert sum(holders.values()) == 150
    assert all(holders.values()), holders
    assert len({int(r[12:16], 16) for r in runs}) > 32  # many shards took part


async def test_cluster_false_against_a_cluster_names_cluster_true_at_the_first_redirect(
    valkey_cluster: Cluster, valkey_namespace: str
) -> None:
    slots = Slots(valkey_cluster)
    namespace = slots.namespace(valkey_namespace, here=True)
    store = ValkeyStore(url=valkey_cluster.url, namespace=namespace, cluster=False)
    # An idempotency key picks the shard: one whose keys live on the node we talk to,
    # and one whose keys live elsewhere.
    shard_of = {f"key-{i}": int(name_hash(f"key-{i}"), 16) % 64 for i in range(200)}
    base = KeySpace(namespace).base_of
    local = next(k for k, s in shard_of.items() if slots.is_here(base(NAME, s)))
    remote = next(k for k, s in shard_of.items() if not slots.is_here(base(NAME, s)))
    async with opened(store):
        # A submit on one server rings the doorbell in the same script, whose keys are in
        # other slots: even a run whose own keys live here meets the cluster at once.
        with pytest.raises(ConfigurationError, match="cluster=True"):
            await store.submit(NAME, {}, now=time.time(), idempotency_key=local)
        assert store.connection.is_cluster is False
        with pytest.raises(ConfigurationError, match="cluster=True"):
            await store.submit(NAME, {}, now=time.time(), idempotency_key=remote)
        # The pipelined paths too: reads over every shard, and scripts batched over shards.
        with pytest.raises(ConfigurationError, match="cluster=True"):
            await store.reclaim(None, now=time.time(), limit=10, poison=PoisonPolicy())
        elsewhere = KeySpace(namespace).new_run_id(NAME, shard_of[remote])
        with pytest.raises(ConfigurationError, match="cluster=True"):
            await store.renew("w", {elsewhere: 1}, now=time.time(), lock_ttl=10)


@pytest.mark.parametrize("meta_here", [False, True], ids=["meta-elsewhere", "meta-here"])
async def test_a_worker_with_cluster_false_against_a_cluster_stops_with_configuration_error(
    valkey_cluster: Cluster, valkey_namespace: str, meta_here: bool
) -> None:
    """Wherever the first redirect comes (the startup checks, or a loop's first call when
    the namespace's record lives on the node the store talks to), run() raises it."""
    namespace = Slots(valkey_cluster).namespace(valkey_namespace, here=meta_here)
    store = ValkeyStore(url=valkey_cluster.url, namespace=namespace, cluster=False)
    async with opened(store):
        worker = make_worker(store, [one_step])
        with pytest.raises(ConfigurationError, match="cluster=True"):
            async with serving(worker, ready=False) as task:
                await task
