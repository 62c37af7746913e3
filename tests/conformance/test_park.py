"""Store contract: park, timers (wake_due), signals, interrupts and wake_run."""

from __future__ import annotations

import pytest

from pyrula.workflows.errors import RunNotActive, WorkflowNotFound
from pyrula.workflows.events import INTERRUPT_SIGNAL, EventType
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
    seqs,
    sleep,
    submit,
    take,
    types,
    wait_for,
)


async def test_park_on_a_timer_releases_the_lock(store: Store) -> None:
    claimed = await running(store, now=T0)

    parked = await store.park(
        claimed.run_id, claimed.token, [ev(EventType.RUN_SLEEPING, T0 + 1, wake_at=T0 + 60)],
        now=T0 + 1, wake_at=T0 + 60, signals=[], known_seq=last_seq(claimed),
    )

    assert parked.parked is True
    assert parked.last_seq == 3
    assert parked.cancel_requested is False
    run = await info(store, claimed.run_id)
    assert run.status == RunStatus.SLEEPING
    assert run.wake_at == T0 + 60
    assert types(await journal(store, claimed.run_id))[-1] == EventType.RUN_SLEEPING
    renewed = await store.renew(WORKER, {claimed.run_id: claimed.token}, now=T0 + 2, lock_ttl=TTL)
    assert renewed.lost == {claimed.run_id}
    # A parked run holds no lock, so the orphan scan never takes it.
    assert await store.reclaim(None, now=T0 + 10_000, limit=10, poison=PoisonPolicy()) == []
    assert await store.claim(WORKER, [WF], limit=10, now=T0 + 2, lock_ttl=TTL) == []


async def test_wake_due_queues_a_sleeping_run_at_its_wake_time(store: Store) -> None:
    claimed = await running(store, now=T0)
    await sleep(store, claimed.run_id, claimed.token, T0 + 60, now=T0 + 1)

    assert await store.wake_due(now=T0 + 59, limit=10) == 0
    assert (await info(store, claimed.run_id)).status == RunStatus.SLEEPING

    assert await store.wake_due(now=T0 + 60, limit=10) == 1
    run = await info(store, claimed.run_id)
    assert run.status == RunStatus.QUEUED
    assert run.wake_at is None
    woken = (await journal(store, claimed.run_id))[-1]
    assert (woken["type"], woken["reason"], woken["ts"]) == (EventType.RUN_WOKEN, "timer", T0 + 60)
    assert await store.wake_due(now=T0 + 61, limit=10) == 0  # woken once

    [again] = await store.claim(WORKER, [WF], limit=1, now=T0 + 61, lock_ttl=TTL)
    assert (again.run_id, again.token) == (claimed.run_id, 2)
    assert types(again.journal)[-2:] == [EventType.RUN_WOKEN, EventType.RUN_STARTED]


async def test_wake_due_honours_limit(store: Store) -> None:
    ids = []
    for i in range(5):
        claimed = await running(store, now=T0)
        await sleep(store, claimed.run_id, claimed.token, T0 + 10 + i, now=T0 + 1)
        ids.append(claimed.run_id)

    assert await store.wake_due(now=T0 + 100, limit=2) == 2
    assert await store.wake_due(now=T0 + 100, limit=10) == 3
    assert await store.wake_due(now=T0 + 100, limit=10) == 0
    for run_id in ids:
        assert (await info(store, run_id)).status == RunStatus.QUEUED


async def test_a_signal_queues_the_run_that_waits_for_it(store: Store) -> None:
    claimed = await running(store, now=T0)
    await wait_for(store, claimed.run_id, claimed.token, "approved", now=T0 + 1)
    run = await info(store, claimed.run_id)
    assert run.status == RunStatus.WAITING
    assert run.waiting_for == ("approved",)
    assert await store.wake_due(now=T0 + 10**6, limit=10) == 0

    await store.signal(claimed.run_id, "other", 1, now=T0 + 2)
    assert (await info(store, claimed.run_id)).status == RunStatus.WAITING

    await store.signal(claimed.run_id, "approved", {"by": "ann"}, now=T0 + 3)
    run = await info(store, claimed.run_id)
    assert run.status == RunStatus.QUEUED
    assert run.waiting_for == ()
    events = await journal(store, claimed.run_id)
    received = [e for e in events if e["type"] == EventType.SIGNAL_RECEIVED]
    assert [(e["name"], e["payload"], e["ts"]) for e in received] == [
        ("other", 1, T0 + 2), ("approved", {"by": "ann"}, T0 + 3)
    ]
    assert seqs(events) == list(range(1, len(events) + 1))
    again = await take(store, claimed.run_id, now=T0 + 4)
    assert again.token == 2


async def test_a_wait_with_a_timeout_is_woken_by_its_timer(store: Store) -> None:
    claimed = await running(store, now=T0)
    await wait_for(store, claimed.run_id, claimed.token, "approved", now=T0 + 1, wake_at=T0 + 30)
    run = await info(store, claimed.run_id)
    assert (run.status, run.wake_at) == (RunStatus.WAITING, T0 + 30)

    assert await store.wake_due(now=T0 + 30, limit=10) == 1

    assert (await info(store, claimed.run_id)).status == RunStatus.QUEUED
    woken = (await journal(store, claimed.run_id))[-1]
    assert (woken["type"], woken["reason"]) == (EventType.RUN_WOKEN, "timer")


async def test_the_timer_of_a_run_woken_otherwise_does_not_fire(store: Store) -> None:
    claimed = await running(store, now=T0)
    await wait_for(store, claimed.run_id, claimed.token, "go", now=T0 + 1, wake_at=T0 + 30)
    await store.signal(claimed.run_id, "go", None, now=T0 + 10)
    again = await take(store, claimed.run_id, now=T0 + 11)

    # Running: the old timer must not touch it.
    assert await store.wake_due(now=T0 + 31, limit=10) == 0
    assert (await info(store, claimed.run_id)).status == RunStatus.RUNNING

    # Parked again on a later timer: the old one must not wake it early.
    await sleep(store, claimed.run_id, again.token, T0 + 600, now=T0 + 32)
    assert await store.wake_due(now=T0 + 100, limit=10) == 0
    assert (await info(store, claimed.run_id)).status == RunStatus.SLEEPING
    assert await store.wake_due(now=T0 + 600, limit=10) == 1


async def test_a_signal_that_arrived_after_known_seq_keeps_the_run(store: Store) -> None:
    claimed = await running(store, now=T0, ttl=10.0)
    known = last_seq(claimed)
    await store.signal(claimed.run_id, "approved", "yes", now=T0 + 1)

    result = await store.park(
        claimed.run_id, claimed.token, [ev(EventType.RUN_WAITING, T0 + 2, signal="approved")],
        now=T0 + 2, wake_at=None, signals=["approved"], known_seq=known,
    )

    assert result.parked is False
    assert result.cancel_requested is False
    events = await journal(store, claimed.run_id)
    assert result.last_seq == len(events) == known + 2  # the signal, then the batch
    assert all(int(e["seq"]) > known for e in result.events)
    signal = [e for e in result.events if e["type"] == EventType.SIGNAL_RECEIVED]
    assert [(e["name"], e["payload"], e["seq"]) for e in signal] == [("approved", "yes", known + 1)]
    # Still running under the same attempt, and the lock is still this attempt's.
    run = await info(store, claimed.run_id)
    assert (run.status, run.attempt) == (RunStatus.RUNNING, claimed.token)
    renewed = await store.renew(WORKER, {claimed.run_id: claimed.token}, now=T0 + 3, lock_ttl=10.0)
    assert renewed.lost == frozenset()
    assert await store.reclaim(None, now=T0 + 5, limit=10, poison=PoisonPolicy()) == []
    appended = await store.append(
        claimed.run_id, claimed.token, [ev(EventType.STEP_STARTED, T0 + 4, step="s", call=2)],
        now=T0 + 4, lock_ttl=10.0,
    )
    assert appended.last_seq == len(events) + 1


async def test_a_signal_already_seen_does_not_stop_the_park(store: Store) -> None:
    claimed = await running(store, now=T0)
    await store.signal(claimed.run_id, "approved", 1, now=T0 + 1)
    seen = len(await journal(store, claimed.run_id))
    await store.signal(claimed.run_id, "unrelated", 2, now=T0 + 2)

    result = await store.park(
        claimed.run_id, claimed.token, [ev(EventType.RUN_WAITING, T0 + 3, signal="approved")],
        now=T0 + 3, wake_at=None, signals=["approved"], known_seq=seen,
    )

    assert result.parked is True
    assert (await info(store, claimed.run_id)).status == RunStatus.WAITING


async def test_a_cancel_requested_while_running_stops_the_park(store: Store) -> None:
    claimed = await running(store, now=T0)
    assert await store.cancel(claimed.run_id, now=T0 + 1) is True

    result = await store.park(
        claimed.run_id, claimed.token, [ev(EventType.RUN_SLEEPING, T0 + 2, wake_at=T0 + 60)],
        now=T0 + 2, wake_at=T0 + 60, signals=[], known_seq=last_seq(claimed),
    )

    assert result.parked is False
    assert result.cancel_requested is True
    assert (await info(store, claimed.run_id)).status == RunStatus.RUNNING
    assert await store.wake_due(now=T0 + 60, limit=10) == 0


async def test_an_interrupt_shows_its_payload_and_resumes_on_its_signal(store: Store) -> None:
    claimed = await running(store, now=T0)
    parked = await store.park(
        claimed.run_id, claimed.token, [ev(EventType.RUN_WAITING, T0 + 1, signal=INTERRUPT_SIGNAL)],
        now=T0 + 1, wake_at=None, signals=[INTERRUPT_SIGNAL], known_seq=last_seq(claimed),
        interrupt={"question": "ship it?"},
    )
    assert parked.parked is True
    run = await info(store, claimed.run_id)
    assert (run.status, run.waiting_for) == (RunStatus.WAITING, (INTERRUPT_SIGNAL,))
    assert run.interrupt == {"question": "ship it?"}

    await store.signal(claimed.run_id, INTERRUPT_SIGNAL, {"answer": "yes"}, now=T0 + 2)

    run = await info(store, claimed.run_id)
    assert run.status == RunStatus.QUEUED
    assert run.interrupt is None
    resumed = (await journal(store, claimed.run_id))[-1]
    assert resumed["type"] == EventType.INTERRUPT_RESUMED
    assert resumed["payload"] == {"answer": "yes"}


async def test_a_signal_to_a_run_not_waiting_for_it_is_only_recorded(store: Store) -> None:
    queued = await submit(store, now=T0)
    sleeping = await running(store, now=T0)
    await sleep(store, sleeping.run_id, sleeping.token, T0 + 600, now=T0 + 1)
    busy = await running(store, now=T0)

    for run_id in (queued, sleeping.run_id, busy.run_id):
        await store.signal(run_id, "note", {"n": 1}, now=T0 + 2)

    assert (await info(store, queued)).status == RunStatus.QUEUED
    assert (await info(store, sleeping.run_id)).status == RunStatus.SLEEPING
    assert (await info(store, busy.run_id)).status == RunStatus.RUNNING
    for run_id in (queued, sleeping.run_id, busy.run_id):
        last = (await journal(store, run_id))[-1]
        assert (last["type"], last["name"], last["payload"]) == (
            EventType.SIGNAL_RECEIVED, "note", {"n": 1}
        )
    # The signal to the queued run is in the journal its next attempt starts from.
    claimed = await take(store, queued, now=T0 + 3)
    assert EventType.SIGNAL_RECEIVED in types(claimed.journal)


async def test_signal_to_an_unknown_run(store: Store) -> None:
    with pytest.raises(WorkflowNotFound):
        await store.signal("0" * 32, "approved", None, now=T0)


async def test_signal_to_an_ended_run(store: Store) -> None:
    done = await running(store, now=T0)
    await complete(store, done.run_id, done.token, now=T0 + 1)
    cancelled = await submit(store, now=T0)
    await store.cancel(cancelled, now=T0 + 1)

    for run_id in (done.run_id, cancelled):
        before = await journal(store, run_id)
        with pytest.raises(RunNotActive):
            await store.signal(run_id, "approved", None, now=T0 + 2)
        assert await journal(store, run_id) == before


async def test_wake_run_wakes_only_a_sleeping_run(store: Store) -> None:
    claimed = await running(store, now=T0)
    await sleep(store, claimed.run_id, claimed.token, T0 + 3600, now=T0 + 1)

    assert await store.wake_run(claimed.run_id, now=T0 + 2) is True
    run = await info(store, claimed.run_id)
    assert run.status == RunStatus.QUEUED
    woken = (await journal(store, claimed.run_id))[-1]
    assert (woken["type"], woken["reason"]) == (EventType.RUN_WOKEN, "manual")
    assert await store.wake_due(now=T0 + 3600, limit=10) == 0  # its timer is spent

    assert await store.wake_run(claimed.run_id, now=T0 + 3) is False  # queued
    await take(store, claimed.run_id, now=T0 + 4)
    assert await store.wake_run(claimed.run_id, now=T0 + 5) is False  # running
