"""Store contract: operations that race on one run resolve as if they ran one after another."""

from __future__ import annotations

import asyncio

from pyrula.workflows.errors import StaleToken
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
    last_seq,
    running,
    types,
    wait_for,
)


async def test_a_finish_racing_the_orphan_scan_has_one_winner(store: Store) -> None:
    claimed = await running(store, now=T0, ttl=10.0)

    finished, scanned = await asyncio.gather(
        complete(store, claimed.run_id, claimed.token, "late", now=T0 + 11),
        store.reclaim(None, now=T0 + 11, limit=10, poison=PoisonPolicy()),
        return_exceptions=True,
    )

    run = await info(store, claimed.run_id)
    events = types(await journal(store, claimed.run_id))
    if isinstance(finished, StaleToken):  # the scan went first
        assert [o.run_id for o in scanned] == [claimed.run_id]
        assert run.status == RunStatus.QUEUED
        assert EventType.RUN_COMPLETED not in events
    else:
        assert finished is None, finished
        assert scanned == []
        assert (run.status, run.result) == (RunStatus.COMPLETED, "late")
        assert EventType.RUN_REQUEUED not in events


async def test_a_signal_racing_a_park_is_never_lost(store: Store) -> None:
    claimed = await running(store, now=T0)

    parked, _ = await asyncio.gather(
        store.park(
            claimed.run_id, claimed.token, [ev(EventType.RUN_WAITING, T0 + 1, signal="go")],
            now=T0 + 1, wake_at=None, signals=["go"], known_seq=last_seq(claimed),
        ),
        store.signal(claimed.run_id, "go", 1, now=T0 + 1),
    )

    status = (await info(store, claimed.run_id)).status
    if parked.parked:  # parked first, then the signal queued it
        assert status == RunStatus.QUEUED
    else:  # the signal came first: the attempt keeps the run and sees the signal
        assert status == RunStatus.RUNNING
        assert EventType.SIGNAL_RECEIVED in types(parked.events)


async def test_a_timer_racing_a_signal_queues_the_run_once(store: Store) -> None:
    claimed = await running(store, now=T0)
    await wait_for(store, claimed.run_id, claimed.token, "go", now=T0 + 1, wake_at=T0 + 30)

    await asyncio.gather(
        store.wake_due(now=T0 + 30, limit=10),
        store.signal(claimed.run_id, "go", 1, now=T0 + 30),
    )

    assert (await info(store, claimed.run_id)).status == RunStatus.QUEUED
    first = await store.claim(WORKER, [WF], limit=10, now=T0 + 31, lock_ttl=TTL)
    assert [c.run_id for c in first] == [claimed.run_id]
    assert await store.claim(WORKER, [WF], limit=10, now=T0 + 31, lock_ttl=TTL) == []
    assert types(await journal(store, claimed.run_id)).count(EventType.RUN_STARTED) == 2


async def test_a_cancel_racing_a_finish_leaves_the_finished_result(store: Store) -> None:
    claimed = await running(store, now=T0)

    _, cancelled = await asyncio.gather(
        complete(store, claimed.run_id, claimed.token, "done", now=T0 + 1),
        store.cancel(claimed.run_id, now=T0 + 1),
    )

    assert isinstance(cancelled, bool)
    run = await info(store, claimed.run_id)
    assert (run.status, run.result) == (RunStatus.COMPLETED, "done")
    assert EventType.RUN_CANCELLED not in types(await journal(store, claimed.run_id))
