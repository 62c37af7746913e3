"""Timers on the Valkey store: a worker learns which shards have timers due from one
summary per workflow name, not from a look at every shard; a summary entry lost (a worker
that died between taking a shard out of it and putting it back) is found again by the
orphan scan's sweep, so the run still wakes."""

from __future__ import annotations

import redis

from pyrula.workflows import RunStatus, ValkeyStore
from tests.conftest import await_until
from tests.integration.valkey_support import make_worker, opened, serving, sleeps


async def test_timers_fire_from_the_summary_and_a_lost_entry_is_found_again(
    valkey_url: str, valkey_namespace: str
) -> None:
    store = ValkeyStore(url=valkey_url, namespace=valkey_namespace, shard_count=8)
    async with opened(store):
        worker = make_worker(store, [sleeps], orphan_scan_interval=0.5)
        client = worker.client
        async with serving(worker):
            quick = await client.submit(sleeps, {"tag": f"{valkey_namespace}-q",
                                                 "seconds": 0.2})
            assert await client.result(quick.run_id, timeout=10) == f"{valkey_namespace}-q!"

            lost = await client.submit(sleeps, {"tag": f"{valkey_namespace}-l",
                                                "seconds": 1.5})

            async def sleeping() -> bool:
                return (await client.get(lost.run_id)).status is RunStatus.SLEEPING

            await await_until(sleeping, timeout=10, what="the run to sleep")
            summary = store.keys.wake("vk.sleeps")
            with redis.Redis.from_url(valkey_url, decode_responses=True) as admin:
                shard = str(int(lost.run_id[12:16], 16))
                assert admin.zscore(summary, shard) is not None  # recorded at the park
                admin.zrem(summary, shard)  # lost, as with a worker dead mid-wake
            assert await client.result(lost.run_id, timeout=15) == f"{valkey_namespace}-l!"
