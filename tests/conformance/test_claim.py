"""Store contract: claim, claim_run, append, read by offset, and lock renewal."""

from __future__ import annotations

import asyncio

from pyrula.workflows.events import EventType
from pyrula.workflows.records import PoisonPolicy, RunStatus
from pyrula.workflows.stores.base import Store
from tests.conformance.support import (
    T0,
    TTL,
    WF,
    WORKER,
    complete,
    ev,
    info,
    journal,
    orphan,
    require_global_order,
    running,
    seqs,
    sleep,
    submit,
    take,
    types,
)


async def test_claim_takes_the_lock_and_appends_run_started(store: Store) -> None:
    run_id = await submit(store, params={"x": 1}, owner="tenant-1")

    [claimed] = await store.claim(WORKER, [WF], limit=1, now=T0 + 1, lock_ttl=TTL)

    assert claimed.run_id == run_id
    assert claimed.token == 1
    assert (claimed.name, claimed.params, claimed.owner) == (WF, {"x": 1}, "tenant-1")
    assert claimed.start_id == run_id
    assert claimed.created_at == T0
    assert types(claimed.journal) == [EventType.RUN_SUBMITTED, EventType.RUN_STARTED]
    assert seqs(claimed.journal) == [1, 2]
    assert claimed.base_seq == 0
    started = claimed.journal[-1]
    assert (started["attempt"], started["worker"], started["ts"]) == (1, WORKER, T0 + 1)
    assert claimed.journal == await journal(store, run_id)
    run = await info(store, run_id)
    assert run.status == RunStatus.RUNNING
    assert run.attempt == 1
    assert run.started_at == T0 + 1


async def test_each_claim_bumps_the_attempt(store: Store) -> None:
    first = await running(store, now=T0, worker="w1")
    await store.requeue(first.run_id, first.token, now=T0 + 1, reason="shutdown")

    second = await take(store, first.run_id, now=T0 + 2, worker="w2")
    await orphan(store, first.run_id, now=T0 + 2 + TTL + 1)
    third = await take(store, first.run_id, now=T0 + 40, worker="w3")

    assert [first.token, second.token, third.token] == [1, 2, 3]
    started = [e for e in await journal(store, first.run_id) if e["type"] == EventType.RUN_STARTED]
    assert [(e["attempt"], e["worker"]) for e in started] == [(1, "w1"), (2, "w2"), (3, "w3")]
    assert (await info(store, first.run_id)).attempt == 3


async def test_claim_returns_the_journal_after_the_last_park(store: Store) -> None:
    claimed = await running(store, now=T0)
    await store.append(
        claimed.run_id, claimed.token,
        [ev(EventType.STEP_STARTED, T0 + 1, step="s", call=1),
         ev(EventType.STEP_COMPLETED, T0 + 2, step="s", call=1, result=1)],
        now=T0 + 2, lock_ttl=TTL,
    )
    await sleep(store, claimed.run_id, claimed.token, T0 + 60, now=T0 + 3)  # parked at seq 5
    await store.wake_due(now=T0 + 60, limit=10)
    await store.signal(claimed.run_id, "note", None, now=T0 + 61)

    resumed = await take(store, claimed.run_id, now=T0 + 62)

    assert resumed.base_seq == 5
    assert seqs(resumed.journal) == [6, 7, 8]
    assert types(resumed.journal) == [
        EventType.RUN_WOKEN, EventType.SIGNAL_RECEIVED, EventType.RUN_STARTED
    ]
    assert (await journal(store, claimed.run_id))[5:] == resumed.journal

    # A requeue is no park point: the next claim still starts after seq 5.
    await store.requeue(claimed.run_id, resumed.token, now=T0 + 63, reason="shutdown")
    again = await take(store, claimed.run_id, now=T0 + 64)
    assert again.base_seq == 5
    assert seqs(again.journal) == [6, 7, 8, 9, 10]
    assert types(again.journal)[-2:] == [EventType.RUN_REQUEUED, EventType.RUN_STARTED]


async def test_claim_honours_limit(store: Store) -> None:
    for i in range(5):
        await submit(store, now=T0 + i)

    assert len(await store.claim(WORKER, [WF], limit=3, now=T0 + 10, lock_ttl=TTL)) == 3
    assert len(await store.claim(WORKER, [WF], limit=10, now=T0 + 10, lock_ttl=TTL)) == 2
    assert await store.claim(WORKER, [WF], limit=10, now=T0 + 10, lock_ttl=TTL) == []
    assert await store.claim(WORKER, [WF], limit=0, now=T0 + 10, lock_ttl=TTL) == []


async def test_claim_takes_only_the_given_names(store: Store) -> None:
    ids = {name: [await submit(store, name, now=T0 + i) for i in range(2)] for name in "abc"}

    claimed = await store.claim(WORKER, ["a", "c"], limit=10, now=T0 + 5, lock_ttl=TTL)

    assert {c.run_id for c in claimed} == set(ids["a"] + ids["c"])
    assert {c.name for c in claimed} == {"a", "c"}
    assert await store.claim(WORKER, ["nobody-serves-this"], limit=10, now=T0, lock_ttl=TTL) == []
    for run_id in ids["b"]:
        assert (await info(store, run_id)).status == RunStatus.QUEUED


async def test_claim_is_fifo_within_one_owner(store: Store) -> None:
    require_global_order(store)
    ids = [await submit(store, owner="tenant-1", now=T0 + i) for i in range(6)]

    order = []
    for _ in ids:
        [claimed] = await store.claim(WORKER, [WF], limit=1, now=T0 + 10, lock_ttl=TTL)
        order.append(claimed.run_id)

    assert order == ids


async def test_a_locked_run_is_not_claimed_again(store: Store) -> None:
    ids = {await submit(store, now=T0 + i) for i in range(3)}
    claimed = await store.claim("w1", [WF], limit=10, now=T0 + 5, lock_ttl=TTL)
    assert {c.run_id for c in claimed} == ids

    assert await store.claim("w2", [WF], limit=10, now=T0 + 6, lock_ttl=TTL) == []
    # Even once the lock has lapsed: only the orphan scan gives such a run back.
    assert await store.claim("w2", [WF], limit=10, now=T0 + 5 + TTL * 3, lock_ttl=TTL) == []
    for run_id in ids:
        assert await store.claim_run(run_id, "w2", now=T0 + 6, lock_ttl=TTL) is None


async def test_concurrent_claims_never_hand_out_a_run_twice(store: Store) -> None:
    ids = {await submit(store, now=T0 + i * 0.25) for i in range(24)}

    batches = await asyncio.gather(
        *(store.claim(f"w{i}", [WF], limit=5, now=T0 + 10, lock_ttl=TTL) for i in range(8))
    )

    claimed = [c.run_id for batch in batches for c in batch]
    assert len(claimed) == len(set(claimed)) == len(ids)
    assert set(claimed) == ids
    assert all(c.token == 1 for batch in batches for c in batch)


async def test_claim_run_claims_only_a_queued_run(store: Store) -> None:
    queued = await submit(store, now=T0)
    claimed = await store.claim_run(queued, WORKER, now=T0 + 1, lock_ttl=TTL)
    assert claimed is not None
    assert (claimed.run_id, claimed.token) == (queued, 1)
    assert types(claimed.journal)[-1] == EventType.RUN_STARTED
    assert (await info(store, queued)).status == RunStatus.RUNNING
    # It left the queue: claim does not hand it out again.
    assert await store.claim(WORKER, [WF], limit=10, now=T0 + 1, lock_ttl=TTL) == []

    assert await store.claim_run(queued, "w2", now=T0 + 2, lock_ttl=TTL) is None  # running
    parked = await running(store, now=T0)
    await sleep(store, parked.run_id, parked.token, T0 + 100, now=T0 + 1)
    assert await store.claim_run(parked.run_id, WORKER, now=T0 + 2, lock_ttl=TTL) is None
    ended = await running(store, now=T0)
    await complete(store, ended.run_id, ended.token, now=T0 + 1)
    assert await store.claim_run(ended.run_id, WORKER, now=T0 + 2, lock_ttl=TTL) is None


async def test_append_assigns_contiguous_seqs(store: Store) -> None:
    claimed = await running(store)
    batch = [
        ev(EventType.STEP_STARTED, T0 + 1, step="charge", call=1, attempt=1),
        ev(EventType.STEP_COMPLETED, T0 + 2, step="charge", call=1, result={"id": "r-1"}),
        ev(EventType.STEP_STARTED, T0 + 3, step="notify", call=2, attempt=1),
    ]

    first = await store.append(claimed.run_id, claimed.token, batch, now=T0 + 3, lock_ttl=TTL)
    second = await store.append(
        claimed.run_id, claimed.token,
        [ev(EventType.STEP_COMPLETED, T0 + 4, step="notify", call=2, result=None)],
        now=T0 + 4, lock_ttl=TTL,
    )

    assert (first.last_seq, second.last_seq) == (5, 6)
    assert first.cancel_requested is False
    events = await journal(store, claimed.run_id)
    assert seqs(events) == [1, 2, 3, 4, 5, 6]
    for written, stored in zip(batch, events[2:5], strict=True):
        assert stored == {**written, "seq": stored["seq"]}
    assert events[5]["result"] is None and events[5]["call"] == 2


async def test_append_renews_the_lock(store: Store) -> None:
    claimed = await running(store, now=T0, ttl=10.0)  # lock until T0 + 10
    await store.append(
        claimed.run_id, claimed.token, [ev(EventType.STEP_STARTED, T0 + 8, step="s", call=1)],
        now=T0 + 8, lock_ttl=10.0,
    )  # lock until T0 + 18

    policy = PoisonPolicy()
    assert await store.reclaim(None, now=T0 + 15, limit=10, poison=policy) == []
    assert (await info(store, claimed.run_id)).status == RunStatus.RUNNING
    outcomes = await store.reclaim(None, now=T0 + 19, limit=10, poison=policy)
    assert [o.run_id for o in outcomes] == [claimed.run_id]


async def test_read_events_after_seq_returns_only_later_events(store: Store) -> None:
    claimed = await running(store)
    await store.append(
        claimed.run_id, claimed.token,
        [ev(EventType.STEP_STARTED, T0, step="s", call=i) for i in range(1, 5)],
        now=T0, lock_ttl=TTL,
    )

    assert seqs(await store.read_events(claimed.run_id)) == [1, 2, 3, 4, 5, 6]
    assert seqs(await store.read_events(claimed.run_id, 0)) == [1, 2, 3, 4, 5, 6]
    assert seqs(await store.read_events(claimed.run_id, 4)) == [5, 6]
    assert [e["call"] for e in await store.read_events(claimed.run_id, 4)] == [3, 4]
    assert await store.read_events(claimed.run_id, 6) == []
    assert await store.read_events(claimed.run_id, 60) == []


async def test_read_events_after_the_first_includes_the_start(store: Store) -> None:
    """Reads from seq 1 or 2 of a young journal (whose first events a store may keep in
    the run record) return the same events a read from the start does."""
    queued = await submit(store)
    assert await store.read_events(queued, 1) == []
    claimed = await running(store)

    assert types(await store.read_events(claimed.run_id, 1)) == [EventType.RUN_STARTED]
    assert await store.read_events(claimed.run_id, 1) == (await journal(store, claimed.run_id))[1:]
    assert await store.read_events(claimed.run_id, 2) == []
    await store.append(
        claimed.run_id, claimed.token, [ev(EventType.STEP_STARTED, T0, step="s", call=1)],
        now=T0, lock_ttl=TTL,
    )
    assert seqs(await store.read_events(claimed.run_id, 1)) == [2, 3]
    assert await store.read_events(claimed.run_id, 1) == (await journal(store, claimed.run_id))[1:]
    assert seqs(await store.read_events(claimed.run_id, 2)) == [3]


async def test_renew_extends_every_held_lock(store: Store) -> None:
    a = await running(store, now=T0, ttl=10.0)
    b = await running(store, now=T0, ttl=10.0)

    renewed = await store.renew(
        WORKER, {a.run_id: a.token, b.run_id: b.token}, now=T0 + 8, lock_ttl=10.0
    )

    assert renewed.lost == frozenset() and renewed.cancel_requested == frozenset()
    policy = PoisonPolicy()
    assert await store.reclaim(None, now=T0 + 15, limit=10, poison=policy) == []
    outcomes = await store.reclaim(None, now=T0 + 19, limit=10, poison=policy)
    assert {o.run_id for o in outcomes} == {a.run_id, b.run_id}


async def test_renew_reports_the_runs_it_no_longer_holds(store: Store) -> None:
    stolen = await running(store, now=T0)
    await orphan(store, stolen.run_id, now=T0 + TTL + 1)
    await take(store, stolen.run_id, now=T0 + TTL + 1, worker="w2")
    held = await running(store, now=T0 + TTL + 1)
    requeued = await running(store, now=T0)
    await store.requeue(requeued.run_id, requeued.token, now=T0 + 1, reason="shutdown")
    finished = await running(store, now=T0)
    await complete(store, finished.run_id, finished.token, now=T0 + 1)
    parked = await running(store, now=T0)
    await sleep(store, parked.run_id, parked.token, T0 + 600, now=T0 + 1)
    missing = "f" * 32

    renewed = await store.renew(
        WORKER,
        {
            held.run_id: held.token,
            stolen.run_id: stolen.token,
            requeued.run_id: requeued.token,
            finished.run_id: finished.token,
            parked.run_id: parked.token,
            missing: 1,
        },
        now=T0 + TTL + 2,
        lock_ttl=TTL,
    )

    assert renewed.lost == {stolen.run_id, requeued.run_id, finished.run_id, parked.run_id, missing}
    assert renewed.cancel_requested == frozenset()


async def test_a_stale_renew_does_not_extend_the_new_holders_lock(store: Store) -> None:
    first = await running(store, now=T0, ttl=10.0)
    await orphan(store, first.run_id, now=T0 + 11)
    second = await take(store, first.run_id, now=T0 + 11, worker="w2", ttl=10.0)  # until T0 + 21

    renewed = await store.renew(WORKER, {first.run_id: first.token}, now=T0 + 20, lock_ttl=100.0)

    assert renewed.lost == {first.run_id}
    outcomes = await store.reclaim(None, now=T0 + 22, limit=10, poison=PoisonPolicy())
    assert [o.run_id for o in outcomes] == [second.run_id]


async def test_renew_of_nothing_is_empty(store: Store) -> None:
    renewed = await store.renew(WORKER, {}, now=T0, lock_ttl=TTL)
    assert (renewed.lost, renewed.cancel_requested) == (frozenset(), frozenset())
