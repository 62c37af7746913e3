"""Store contract: what an ArchivingStore reads of its live store (ended_runs) and asks of it
(expire_finished)."""

from __future__ import annotations

from typing import Any

from pyrula.workflows.records import RunStatus
from tests.conformance.support import T0, complete, info, journal, running, submit


async def test_ended_runs_lists_runs_that_ended_oldest_first_from_a_cursor(store: Any) -> None:
    queued = await submit(store, now=T0)
    live = await running(store, now=T0)
    ended = []
    for i in range(4):
        claimed = await running(store, now=T0 + i)
        await complete(store, claimed.run_id, claimed.token, now=T0 + 10 + i)
        ended.append((T0 + 10 + i, claimed.run_id))
    cancelled = await submit(store, now=T0)
    await store.cancel(cancelled, now=T0 + 20)
    ended.append((T0 + 20, cancelled))

    every = await store.ended_runs(after=None, until=T0 + 100, limit=100)
    assert every == ended
    assert {queued, live.run_id}.isdisjoint(run_id for _, run_id in every)
    assert await store.ended_runs(after=None, until=T0 + 100, limit=2) == ended[:2]
    assert await store.ended_runs(after=ended[1], until=T0 + 100, limit=100) == ended[2:]
    assert await store.ended_runs(after=ended[1], until=T0 + 12, limit=100) == [ended[2]]
    assert await store.ended_runs(after=ended[-1], until=T0 + 100, limit=100) == []


async def test_ended_runs_orders_runs_that_ended_at_once_by_id(store: Any) -> None:
    ids = [await submit(store, now=T0 + i) for i in range(5)]
    for run_id in ids:
        await store.cancel(run_id, now=T0 + 10)
    order = sorted(ids)

    first = await store.ended_runs(after=None, until=T0 + 10, limit=2)
    rest = await store.ended_runs(after=first[-1], until=T0 + 10, limit=10)

    assert [r for _, r in first + rest] == order


async def test_a_page_from_a_cursor_is_full_while_runs_remain(store: Any) -> None:
    """A cursor-paged read gives ``limit`` runs whenever that many remain after the cursor
    (a shorter page from one shard could let another shard's later run pass before the
    runs it left unread, and a cursor moved past them would skip them)."""
    ended = []
    for i in range(7):
        claimed = await running(store, now=T0 + i)
        await complete(store, claimed.run_id, claimed.token, now=T0 + 10 + i)
        ended.append((T0 + 10 + i, claimed.run_id))

    pages, cursor = [], None
    while page := await store.ended_runs(after=cursor, until=T0 + 100, limit=3):
        pages.append(page)
        cursor = page[-1]

    assert [len(p) for p in pages] == [3, 3, 1]
    assert [r for p in pages for r in p] == ended


async def test_expire_finished_leaves_runs_in_flight_and_reads_alone(store: Any) -> None:
    claimed = await running(store, now=T0)
    done = await running(store, now=T0)
    await complete(store, done.run_id, done.token, {"ok": 1}, now=T0 + 1)

    await store.expire_finished([claimed.run_id, done.run_id], 300)
    await store.expire_finished([], 300)

    assert (await info(store, claimed.run_id)).status == RunStatus.RUNNING
    assert (await info(store, done.run_id)).result == {"ok": 1}
    assert len(await journal(store, done.run_id)) == 3
