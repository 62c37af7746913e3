"""Timers on the Valkey store: a worker learns which shards have timers due from one
summary per workflow name, not from a look at every shard. A scan leases a due shard's
entry (moves it ahead), wakes the shard, then settles the entry on its earliest timer left
unless a parker lowered it meanwhile; a scan that dies mid-way leaves a lease that falls
due again, so the run still wakes."""

from __future__ import annotations

import time

import redis

from pyrula.workflows import RunStatus, ValkeyStore
from tests.conftest import await_until
from tests.integration.valkey_support import make_worker, opened, serving, sleeps


async def test_a_lease_left_by_a_scan_that_died_falls_due_again(
    valkey_url: str, valkey_namespace: str
) -> None:
    store = ValkeyStore(url=valkey_url, namespace=valkey_namespace, shard_count=8)
    async with opened(store):
        worker = make_worker(store, [sleeps])
        client = worker.client
        async with serving(worker):
            quick = await client.submit(sleeps, {"tag": f"{valkey_namespace}-q",
                                                 "seconds": 0.2})
            assert await client.result(quick.run_id, timeout=10) == f"{valkey_namespace}-q!"

            left = await client.submit(sleeps, {"tag": f"{valkey_namespace}-l",
                                                "seconds": 0.5})

            async def sleeping() -> bool:
                return (await client.get(left.run_id)).status is RunStatus.SLEEPING

            await await_until(sleeping, timeout=10, what="the run to sleep")
            summary = store.keys.wake("vk.sleeps")
            shard = str(int(left.run_id[12:16], 16))
            with redis.Redis.from_url(valkey_url, decode_responses=True) as admin:
                assert admin.zscore(summary, shard) is not None  # recorded at the park
                # As a scan that leased the entry and died before settling it would leave
                # it (a short lease, so the test need not wait the real one).
                admin.zadd(summary, {shard: time.time() + 2.0})
            assert await client.result(left.run_id, timeout=15) == f"{valkey_namespace}-l!"
            with redis.Redis.from_url(valkey_url, decode_responses=True) as admin:
                assert admin.zscore(summary, shard) is None  # settled: no timer left


async def test_settling_keeps_a_time_a_parker_lowered(valkey_url: str,
                                                      valkey_namespace: str) -> None:
    store = ValkeyStore(url=valkey_url, namespace=valkey_namespace, shard_count=8)
    summary = store.keys.wake("vk.settle")
    lease = "5000.5"
    async with opened(store):
        with redis.Redis.from_url(valkey_url, decode_responses=True) as admin:
            # 1: still our lease, timers left; 2: our lease, none left; 3: a parker lowered
            # it below the next timer; 4: lost, a timer left.
            admin.zadd(summary, {"1": 5000.5, "2": 5000.5, "3": 1200.0})
            assert await store._op(summary, "timer_settle", lease, 1, 3000, 2, "", 3, 4000,
                                   4, 6000) == 4
            assert admin.zrange(summary, 0, -1, withscores=True) == [
                ("3", 1200.0), ("1", 3000.0), ("4", 6000.0)]
