"""Store contract: ``nudge``, a child's word to its parent that it has ended, which writes
nothing in the parent's journal. A parent waiting for its children is queued; a parent
running is marked, and its next park waiting for them is refused once (the wake-up a
child ending between the parent's look and its park would otherwise lose); any other run
is left as it is."""

from __future__ import annotations

from typing import Any

from pyrula.workflows.events import CHILD_SIGNAL, EventType
from pyrula.workflows.records import ParkResult, RunStatus
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
    sleep,
    submit,
    types,
    wait_for,
)


async def _park_on_children(store: Store, run_id: str, token: int, *, now: float,
                            known_seq: int, events: Any = ()) -> ParkResult:
    """Park as a parent waiting for its children does: a re-check timer and their nudge."""
    return await store.park(
        run_id, token, list(events), now=now, wake_at=now + 60,
        signals=[CHILD_SIGNAL], known_seq=known_seq,
    )


async def test_a_nudge_while_the_parent_runs_refuses_its_next_park_on_children(
        store: Store) -> None:
    claimed = await running(store, now=T0)
    known = last_seq(claimed)
    before = await journal(store, claimed.run_id)

    await store.nudge(claimed.run_id, now=T0 + 1)  # the child ended after the parent looked

    assert await journal(store, claimed.run_id) == before
    refused = await _park_on_children(store, claimed.run_id, claimed.token, now=T0 + 2,
                                      known_seq=known)
    assert (refused.parked, refused.last_seq, refused.events) == (False, known, [])
    assert refused.cancel_requested is False
    assert (await info(store, claimed.run_id)).status is RunStatus.RUNNING  # it keeps its lock

    # The refused park cleared the mark: after another look, the run parks.
    parked = await _park_on_children(
        store, claimed.run_id, claimed.token, now=T0 + 3, known_seq=known,
        events=[ev(EventType.RUN_WAITING, T0 + 3, signal=CHILD_SIGNAL)],
    )
    assert parked.parked is True
    assert (await info(store, claimed.run_id)).status is RunStatus.WAITING


async def test_a_refused_park_carries_its_batch_and_nothing_of_the_nudge(store: Store) -> None:
    claimed = await running(store, now=T0)
    known = last_seq(claimed)
    await store.nudge(claimed.run_id, now=T0 + 1)
    await store.nudge(claimed.run_id, now=T0 + 2)  # two children ended: one mark

    refused = await _park_on_children(
        store, claimed.run_id, claimed.token, now=T0 + 3, known_seq=known,
        events=[ev(EventType.RUN_WAITING, T0 + 3, signal=CHILD_SIGNAL)],
    )

    assert refused.parked is False
    assert types(refused.events) == [EventType.RUN_WAITING]
    assert refused.last_seq == known + 1
    assert not [e for e in await journal(store, claimed.run_id)
                if e["type"] == EventType.SIGNAL_RECEIVED]
    again = await _park_on_children(store, claimed.run_id, claimed.token, now=T0 + 4,
                                    known_seq=known + 1)
    assert again.parked is True


async def test_a_nudge_does_not_refuse_a_park_on_other_signals_and_any_park_clears_it(
        store: Store) -> None:
    claimed = await running(store, now=T0)
    await store.nudge(claimed.run_id, now=T0 + 1)

    await wait_for(store, claimed.run_id, claimed.token, "approved", now=T0 + 2)

    assert (await info(store, claimed.run_id)).status is RunStatus.WAITING
    await store.signal(claimed.run_id, "approved", None, now=T0 + 3)
    again = await store.claim_run(claimed.run_id, WORKER, now=T0 + 4, lock_ttl=TTL)
    assert again is not None
    # The park on "approved" cleared the mark: this attempt parks on its children.
    parked = await _park_on_children(store, again.run_id, again.token, now=T0 + 5,
                                     known_seq=last_seq(again))
    assert parked.parked is True


async def test_a_sleep_clears_the_mark_too(store: Store) -> None:
    claimed = await running(store, now=T0)
    await store.nudge(claimed.run_id, now=T0 + 1)
    await sleep(store, claimed.run_id, claimed.token, T0 + 10, now=T0 + 2)
    assert await store.wake_due(now=T0 + 10, limit=10) == 1
    again = await store.claim_run(claimed.run_id, WORKER, now=T0 + 11, lock_ttl=TTL)
    assert again is not None

    parked = await _park_on_children(store, again.run_id, again.token, now=T0 + 12,
                                     known_seq=last_seq(again))

    assert parked.parked is True


async def test_a_nudge_queues_a_parent_waiting_for_its_children_and_writes_nothing(
        store: Store) -> None:
    claimed = await running(store, now=T0)
    parked = await _park_on_children(
        store, claimed.run_id, claimed.token, now=T0 + 1, known_seq=last_seq(claimed),
        events=[ev(EventType.RUN_WAITING, T0 + 1, signal=CHILD_SIGNAL)],
    )
    assert parked.parked is True
    before = await journal(store, claimed.run_id)

    await store.nudge(claimed.run_id, now=T0 + 2)

    run = await info(store, claimed.run_id)
    assert run.status is RunStatus.QUEUED
    assert run.wake_at is None  # the re-check timer is gone with the wait
    assert await journal(store, claimed.run_id) == before
    assert await store.wake_due(now=T0 + 100, limit=10) == 0
    [again] = await store.claim(WORKER, [WF], limit=1, now=T0 + 3, lock_ttl=TTL)
    assert (again.run_id, again.token) == (claimed.run_id, 2)
    assert types(again.journal) == [EventType.RUN_STARTED]
    # A nudge that found the run parked leaves no mark: its next attempt parks.
    assert (await _park_on_children(store, again.run_id, again.token, now=T0 + 4,
                                    known_seq=last_seq(again))).parked is True


async def test_a_nudge_leaves_a_run_waiting_for_something_else(store: Store) -> None:
    claimed = await running(store, now=T0)
    await wait_for(store, claimed.run_id, claimed.token, "approved", now=T0 + 1)
    before = await journal(store, claimed.run_id)

    await store.nudge(claimed.run_id, now=T0 + 2)

    assert (await info(store, claimed.run_id)).status is RunStatus.WAITING
    assert await journal(store, claimed.run_id) == before


async def test_a_nudge_of_a_queued_sleeping_or_ended_run_does_nothing(store: Store) -> None:
    queued = await submit(store, now=T0)
    sleeping = await running(store, now=T0)
    await sleep(store, sleeping.run_id, sleeping.token, T0 + 60, now=T0 + 1)
    ended = await running(store, now=T0)
    await complete(store, ended.run_id, ended.token, "done", now=T0 + 1)
    runs = {run_id: (await info(store, run_id), await journal(store, run_id))
            for run_id in (queued, sleeping.run_id, ended.run_id)}

    for run_id in runs:
        await store.nudge(run_id, now=T0 + 2)
    await store.nudge("no-such-run", now=T0 + 2)  # an unknown parent: nobody to tell

    for run_id, (was, events) in runs.items():
        now = await info(store, run_id)
        assert (now.status, now.wake_at) == (was.status, was.wake_at), run_id
        assert await journal(store, run_id) == events, run_id
    # The queued run's first attempt owes nothing to the nudge: it parks on its children.
    [first] = await store.claim(WORKER, [WF], limit=1, now=T0 + 3, lock_ttl=TTL)
    assert first.run_id == queued
    assert (await _park_on_children(store, queued, first.token, now=T0 + 4,
                                    known_seq=last_seq(first))).parked is True
