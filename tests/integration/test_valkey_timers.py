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
            assert await store.connection.op(summary, "timer_settle", lease, 1, 3000, 2, "",
                                             3, 4000, 4, 6000) == 4
            assert admin.zrange(summary, 0, -1, withscores=True) == [
                ("3", 1200.0), ("1", 3000.0), ("4", 6000.0)]


async def test_timers_fall_due_on_time_not_at_the_next_poll(
    valkey_url: str, valkey_namespace: str
) -> None:
    """With a 60 s timer poll, a 0.3 s sleep still ends within seconds: the loop sleeps
    until the next timer the summary shows, not a whole interval."""
    store = ValkeyStore(url=valkey_url, namespace=valkey_namespace, shard_count=8)
    async with opened(store):
        worker = make_worker(store, [sleeps], timer_poll_interval_s=60.0)
        client = worker.client
        async with serving(worker):
            runs = [await client.submit(sleeps, {"tag": f"{valkey_namespace}-{i}",
                                                 "seconds": 0.3 + i * 0.2})
                    for i in range(3)]
            for i, run in enumerate(runs):
                assert await client.result(run.run_id, timeout=20) == f"{valkey_namespace}-{i}!"


async def test_many_timers_due_together_are_woken_batch_after_batch(
    valkey_url: str, valkey_namespace: str
) -> None:
    """A batch spread over shards can come back short of timer_max_batch while more are
    due: the loop goes on at once, not after another interval."""
    from datetime import UTC, datetime

    from pyrula.workflows import WorkflowContext, step, workflow
    from tests.integration.valkey_support import noop  # noqa: F401  (a second name)

    @step(name="vk.due_together.step")
    async def add(x: int) -> int:
        return x + 1

    @workflow(name="vk.due_together")
    async def due_together(ctx: WorkflowContext, params: dict[str, float]) -> int:
        await ctx.sleep_until(datetime.fromtimestamp(params["until"], UTC))
        return await add(int(params["x"]))

    store = ValkeyStore(url=valkey_url, namespace=valkey_namespace, shard_count=8)
    async with opened(store):
        worker = make_worker(store, [due_together], timer_poll_interval_s=60.0,
                             timer_max_batch=7)
        client = worker.client
        async with serving(worker):
            until = time.time() + 2.0
            runs = [await client.submit(due_together, {"x": i, "until": until})
                    for i in range(120)]
            for i, run in enumerate(runs):
                assert await client.result(run.run_id, timeout=20) == i + 1
