"""Flow control under load on a sharded ValkeyStore: an owner's cap on runs executing at
once and on starts per second holds across two workers (each with a store object of its
own, as two processes would have), while other owners' runs proceed."""

from __future__ import annotations

import time

from pyrula.workflows import RunStatus, ValkeyStore, WorkerOptions
from tests.conftest import await_until
from tests.integration.valkey_support import (
    LEDGER,
    all_ended,
    gate,
    held,
    keys_on_shards,
    make_worker,
    one_step,
    opened,
    serving,
    statuses,
)

NAME = "vk.held"


async def test_a_claim_that_finds_nothing_holds_no_flow_control_slot(
    valkey_url: str, valkey_namespace: str
) -> None:
    """Regression: an empty claim used to reserve the owner's slots (and rate tokens) and
    never give them back, so after any idle poll the owner's next runs waited a lock_ttl."""
    store = ValkeyStore(url=valkey_url, namespace=valkey_namespace, shard_count=4)
    async with opened(store):
        await store.aflow_control_set("t", max_concurrent=1, max_starts_per_second=1.0)
        now = time.time()
        assert await store.claim("w", [NAME], limit=10, now=now, lock_ttl=60) == []
        handle, _ = await store.submit(NAME, {}, now=now, owner="t")
        claimed = await store.claim("w", [NAME], limit=10, now=now, lock_ttl=60)
        assert [c.run_id for c in claimed] == [handle.run_id]


async def test_a_worker_whose_own_shards_hold_only_held_back_runs_claims_elsewhere(
    valkey_url: str, valkey_namespace: str
) -> None:
    """Regression: a claim visited only the worker's own rung shards when there were as
    many as it had free slots; if they held only runs flow control held back, the runs
    queued on another worker's shards waited until that worker had a free slot."""
    mine = ValkeyStore(url=valkey_url, namespace=valkey_namespace, shard_count=4)
    theirs = ValkeyStore(url=valkey_url, namespace=valkey_namespace, shard_count=4)
    async with opened(mine, theirs):
        now = time.time()
        lease = WorkerOptions(shard_lease_ttl=60)
        for store, worker_id in ((mine, "w1"), (theirs, "w2"), (mine, "w1"), (theirs, "w2")):
            await store.shard_lease_tick(worker_id=worker_id, names=[NAME], now=now,
                                         options=lease)
        assert (mine.shards_held("w1"), theirs.shards_held("w2")) == ({NAME: 2}, {NAME: 2})
        own, other = sorted(mine.leases.held["w1"][NAME]), sorted(theirs.leases.held["w2"][NAME])

        await mine.aflow_control_set("t", max_concurrent=1)
        keys = keys_on_shards([other[0], own[0], own[1], other[1]], 4, valkey_namespace)
        first, _ = await theirs.submit(NAME, {}, now=now, owner="t", idempotency_key=keys[0])
        [taken] = await theirs.claim("w2", [NAME], limit=1, now=now, lock_ttl=60)
        assert taken.run_id == first.run_id  # t is at its cap now
        for key in keys[1:3]:  # held back, on w1's own shards
            await mine.submit(NAME, {}, now=now, owner="t", idempotency_key=key)
        runnable, _ = await mine.submit(NAME, {}, now=now, owner="u", idempotency_key=keys[3])

        for limit in (1, 2, 3):
            # The claims visit the rung shards in turn: within one round of the 4, the run.
            rounds = [await mine.claim("w1", [NAME], limit=limit, now=now, lock_ttl=60)
                      for _ in range(4)]
            claimed = [c.run_id for batch in rounds for c in batch]
            assert claimed == [runnable.run_id], limit
            token = next(c.token for batch in rounds for c in batch)
            await mine.requeue(runnable.run_id, token, now=now, reason="test")


async def test_max_concurrent_holds_across_two_workers_while_others_proceed(
    valkey_url: str, valkey_namespace: str
) -> None:
    LEDGER.clear()
    t_gate, u_gate = gate(f"{valkey_namespace}-t"), gate(f"{valkey_namespace}-u")
    stores = [ValkeyStore(url=valkey_url, namespace=valkey_namespace) for _ in range(2)]
    async with opened(*stores):
        stores[0].flow_control_set("t", max_concurrent=3)
        # 8 slots each: the 13 gated runs below cannot all fit on one worker.
        workers = [make_worker(s, [held], max_concurrent_runs=8) for s in stores]
        client = workers[0].client

        async def submit(owner: str, count: int, gate_name: str = "") -> list[str]:
            return [
                (await client.submit(held, {"tag": f"{owner}{gate_name}{i}", "group": owner,
                                            "gate": gate_name}, owner=owner)).run_id
                for i in range(count)
            ]

        async with serving(workers[0]), serving(workers[1]):
            t_runs = await submit("t", 12, f"{valkey_namespace}-t")
            u_runs = await submit("u", 10, f"{valkey_namespace}-u")
            await await_until(lambda: LEDGER.active["t"] == 3 and LEDGER.active["u"] == 10,
                              what="3 runs of t and 10 of u to be executing")
            assert all(w.in_flight for w in workers)  # both workers hold some of them
            # While t is at its cap, other owners' runs come and go through many claims.
            more_u = await submit("u", 10)
            await all_ended(stores[0], more_u)
            assert LEDGER.active["t"] == 3 and LEDGER.peak["t"] == 3
            assert await statuses(stores[0], t_runs) == {RunStatus.RUNNING: 3,
                                                         RunStatus.QUEUED: 9}
            # Let everything go: t's runs drain three at a time, under churn.
            churn = await submit("t", 12)
            t_gate.set()
            u_gate.set()
            await all_ended(stores[0], [*t_runs, *u_runs, *churn])
        assert LEDGER.peak["t"] == 3, LEDGER.peak
        assert LEDGER.peak["u"] >= 10
        assert await statuses(stores[0], [*t_runs, *u_runs, *more_u, *churn]) == {
            RunStatus.COMPLETED: 44}


async def test_max_starts_per_second_bounds_the_starts_across_two_workers(
    valkey_url: str, valkey_namespace: str
) -> None:
    rate = 20
    stores = [ValkeyStore(url=valkey_url, namespace=valkey_namespace) for _ in range(2)]
    async with opened(*stores):
        stores[0].flow_control_set("t", max_starts_per_second=float(rate))
        workers = [make_worker(s, [one_step]) for s in stores]
        client = workers[0].client
        async with serving(workers[0]), serving(workers[1]):
            runs = [(await client.submit(one_step, {"tag": f"{valkey_namespace}-{i}"},
                                         owner="t")).run_id for i in range(2 * rate + 10)]
            others = [(await client.submit(one_step, {"tag": f"{valkey_namespace}-o{i}"},
                                           owner="other")).run_id for i in range(20)]
            await all_ended(stores[0], [*runs, *others])
        starts: list[float] = []
        for run_id in runs:
            started = [e for e in await stores[0].read_events(run_id)
                       if e["type"] == "run:started"]
            assert started
            # Every claim takes a start from the bucket (a run requeued under load is
            # claimed again): the claim's time, as the bucket saw it.
            starts.extend(float(e["ts"]) for e in started)
    # The bucket holds a second's worth of starts; beyond it, starts come at the rate.
    # Over every window [starts[i], starts[j]]: at most rate * length + rate (+1 for the
    # store's float rounding) starts. Unthrottled, all 50 would start within a few polls.
    starts.sort()
    for i in range(len(starts)):
        for j in range(i, len(starts)):
            allowed = rate * (starts[j] - starts[i]) + rate + 1
            assert j - i + 1 <= allowed, (i, j, starts[j] - starts[i])
