"""Store contract: finish (completed, failed, cancelled, continued), wait_result and cancel."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from pyrula.errors import RunNotActive
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
    running,
    sleep,
    submit,
    types,
    wait_for,
)

#: How long a waiter may take to notice a finish: generous, it only bounds a hang.
WAKE_DEADLINE = 5.0

ERROR = {"code": "workflow_error", "error_type": "KeyError", "message": "'sku'", "detail": None}


async def test_finish_completed(store: Store) -> None:
    claimed = await running(store, now=T0)

    finished = await store.finish(
        claimed.run_id, claimed.token, [ev(EventType.RUN_COMPLETED, T0 + 5, result={"ok": 1})],
        now=T0 + 5, status=RunStatus.COMPLETED, result={"ok": 1},
    )

    assert finished.last_seq == 3
    assert finished.successor_id is None
    run = await info(store, claimed.run_id)
    assert (run.status, run.result, run.error) == (RunStatus.COMPLETED, {"ok": 1}, None)
    assert run.finished_at == T0 + 5
    assert types(await journal(store, claimed.run_id))[-1] == EventType.RUN_COMPLETED
    renewed = await store.renew(WORKER, {claimed.run_id: claimed.token}, now=T0 + 6, lock_ttl=TTL)
    assert renewed.lost == {claimed.run_id}
    assert await store.reclaim(None, now=T0 + 10_000, limit=10, poison=PoisonPolicy()) == []


async def test_finish_failed(store: Store) -> None:
    claimed = await running(store, now=T0)

    await store.finish(
        claimed.run_id, claimed.token, [ev(EventType.RUN_ERROR, T0 + 5, **ERROR)],
        now=T0 + 5, status=RunStatus.FAILED, error=ERROR,
    )

    run = await info(store, claimed.run_id)
    assert (run.status, run.result, run.error) == (RunStatus.FAILED, None, ERROR)
    assert run.finished_at == T0 + 5
    last = (await journal(store, claimed.run_id))[-1]
    assert (last["type"], last["code"], last["message"]) == (
        EventType.RUN_ERROR, "workflow_error", "'sku'"
    )


async def test_finish_cancelled(store: Store) -> None:
    claimed = await running(store, now=T0)

    await store.finish(
        claimed.run_id, claimed.token, [ev(EventType.RUN_CANCELLED, T0 + 5)],
        now=T0 + 5, status=RunStatus.CANCELLED,
    )

    run = await info(store, claimed.run_id)
    assert (run.status, run.result, run.error) == (RunStatus.CANCELLED, None, None)
    assert types(await journal(store, claimed.run_id))[-1] == EventType.RUN_CANCELLED


async def test_finish_appends_its_whole_batch(store: Store) -> None:
    claimed = await running(store, now=T0)

    finished = await store.finish(
        claimed.run_id, claimed.token,
        [
            ev(EventType.STEP_STARTED, T0 + 1, step="s", call=1),
            ev(EventType.STEP_COMPLETED, T0 + 2, step="s", call=1, result=7),
            ev(EventType.RUN_COMPLETED, T0 + 3, result=7),
        ],
        now=T0 + 3, status=RunStatus.COMPLETED, result=7,
    )

    assert finished.last_seq == 5
    assert types(await journal(store, claimed.run_id))[2:] == [
        EventType.STEP_STARTED, EventType.STEP_COMPLETED, EventType.RUN_COMPLETED
    ]


async def test_wait_result_of_an_ended_run_returns_at_once(store: Store) -> None:
    claimed = await running(store, now=T0)
    await complete(store, claimed.run_id, claimed.token, "r", now=T0 + 1)

    run = await store.wait_result(claimed.run_id, timeout=WAKE_DEADLINE)

    assert (run.run_id, run.status, run.result) == (claimed.run_id, RunStatus.COMPLETED, "r")


async def test_wait_result_is_woken_by_finish(store: Store) -> None:
    claimed = await running(store, now=T0)
    waiters = [
        asyncio.create_task(store.wait_result(claimed.run_id, timeout=None)) for _ in range(3)
    ]
    for _ in range(5):
        await asyncio.sleep(0)
    assert not any(w.done() for w in waiters)

    await complete(store, claimed.run_id, claimed.token, {"total": 3}, now=T0 + 1)

    done = await asyncio.wait_for(asyncio.gather(*waiters), WAKE_DEADLINE)
    assert [(r.status, r.result) for r in done] == [(RunStatus.COMPLETED, {"total": 3})] * 3


async def test_wait_result_is_woken_by_a_cancel(store: Store) -> None:
    run_id = await submit(store, now=T0)
    waiter = asyncio.create_task(store.wait_result(run_id, timeout=None))
    await asyncio.sleep(0)

    assert await store.cancel(run_id, now=T0 + 1) is True

    run = await asyncio.wait_for(waiter, WAKE_DEADLINE)
    assert run.status == RunStatus.CANCELLED


async def test_wait_result_times_out(store: Store) -> None:
    run_id = await submit(store, now=T0)

    with pytest.raises(TimeoutError):
        await store.wait_result(run_id, timeout=0.05)

    assert (await info(store, run_id)).status == RunStatus.QUEUED


async def _continue(store: Store, run_id: str, token: int, params: Any, now: float) -> str:
    finished = await store.finish(
        run_id, token, [ev(EventType.RUN_CONTINUED, now)],
        now=now, status=RunStatus.CONTINUED, successor_params=params,
    )
    assert finished.successor_id is not None
    return finished.successor_id


async def test_continued_queues_a_successor_with_the_same_start_id(store: Store) -> None:
    first = await running(store, params={"n": 1}, owner="tenant-1", now=T0)

    second_id = await _continue(store, first.run_id, first.token, {"n": 2}, T0 + 1)

    assert second_id != first.run_id
    ended = await info(store, first.run_id)
    assert (ended.status, ended.successor_id) == (RunStatus.CONTINUED, second_id)
    terminal = (await journal(store, first.run_id))[-1]
    assert (terminal["type"], terminal["successor"]) == (EventType.RUN_CONTINUED, second_id)
    successor = await info(store, second_id)
    assert successor.status == RunStatus.QUEUED
    assert (successor.name, successor.owner, successor.params) == (WF, "tenant-1", {"n": 2})
    assert successor.start_id == first.run_id
    assert successor.attempt == 0
    assert types(await journal(store, second_id)) == [EventType.RUN_SUBMITTED]
    assert (await store.wait_result(first.run_id, timeout=WAKE_DEADLINE)).status == (
        RunStatus.CONTINUED
    )

    [claimed] = await store.claim(WORKER, [WF], limit=1, now=T0 + 2, lock_ttl=TTL)
    assert (claimed.run_id, claimed.token, claimed.start_id) == (second_id, 1, first.run_id)
    third_id = await _continue(store, second_id, claimed.token, {"n": 3}, T0 + 3)
    assert (await info(store, third_id)).start_id == first.run_id


async def test_the_successor_of_a_run_without_owner_has_none(store: Store) -> None:
    first = await running(store, now=T0)

    successor = await info(store, await _continue(store, first.run_id, first.token, [], T0 + 1))

    assert (successor.owner, successor.params, successor.start_id) == (None, [], first.run_id)


async def test_cancel_of_a_queued_run_ends_it_at_once(store: Store) -> None:
    run_id = await submit(store, now=T0)

    assert await store.cancel(run_id, now=T0 + 1) is True

    run = await info(store, run_id)
    assert run.status == RunStatus.CANCELLED
    assert run.finished_at == T0 + 1
    assert types(await journal(store, run_id)) == [
        EventType.RUN_SUBMITTED, EventType.RUN_CANCELLED
    ]
    assert await store.claim(WORKER, [WF], limit=10, now=T0 + 2, lock_ttl=TTL) == []
    assert await store.claim_run(run_id, WORKER, now=T0 + 2, lock_ttl=TTL) is None


async def test_cancel_of_a_parked_run_ends_it_at_once(store: Store) -> None:
    sleeping = await running(store, now=T0)
    await sleep(store, sleeping.run_id, sleeping.token, T0 + 60, now=T0 + 1)
    waiting = await running(store, now=T0)
    await wait_for(store, waiting.run_id, waiting.token, "go", now=T0 + 1)

    for run_id in (sleeping.run_id, waiting.run_id):
        assert await store.cancel(run_id, now=T0 + 2) is True
        assert (await info(store, run_id)).status == RunStatus.CANCELLED
        assert types(await journal(store, run_id))[-1] == EventType.RUN_CANCELLED
    assert await store.wake_due(now=T0 + 60, limit=10) == 0
    assert (await info(store, sleeping.run_id)).status == RunStatus.CANCELLED


async def test_cancel_of_a_running_run_tells_its_worker(store: Store) -> None:
    claimed = await running(store, now=T0)

    assert await store.cancel(claimed.run_id, now=T0 + 1) is True

    assert (await info(store, claimed.run_id)).status == RunStatus.RUNNING
    renewed = await store.renew(WORKER, {claimed.run_id: claimed.token}, now=T0 + 2, lock_ttl=TTL)
    assert renewed.cancel_requested == {claimed.run_id}
    assert renewed.lost == frozenset()
    appended = await store.append(
        claimed.run_id, claimed.token, [ev(EventType.STEP_STARTED, T0 + 3, step="s", call=1)],
        now=T0 + 3, lock_ttl=TTL,
    )
    assert appended.cancel_requested is True
    assert (await info(store, claimed.run_id)).status == RunStatus.RUNNING

    await store.finish(
        claimed.run_id, claimed.token, [ev(EventType.RUN_CANCELLED, T0 + 4)],
        now=T0 + 4, status=RunStatus.CANCELLED,
    )
    assert (await info(store, claimed.run_id)).status == RunStatus.CANCELLED


async def test_a_cancel_requested_run_that_is_requeued_ends_cancelled(store: Store) -> None:
    """Reference behaviour: a requeue (shutdown, crash) does not outlive a cancel request."""
    claimed = await running(store, now=T0)
    await store.cancel(claimed.run_id, now=T0 + 1)

    outcome = await store.requeue(claimed.run_id, claimed.token, now=T0 + 2, reason="shutdown")

    assert outcome.quarantined is False
    assert (await info(store, claimed.run_id)).status == RunStatus.CANCELLED
    assert types(await journal(store, claimed.run_id))[-1] == EventType.RUN_CANCELLED


async def test_cancel_of_an_ended_run_returns_false(store: Store) -> None:
    done = await running(store, now=T0)
    await complete(store, done.run_id, done.token, "r", now=T0 + 1)
    cancelled = await submit(store, now=T0)
    await store.cancel(cancelled, now=T0 + 1)

    for run_id in (done.run_id, cancelled):
        before = await journal(store, run_id)
        assert await store.cancel(run_id, now=T0 + 2) is False
        assert await journal(store, run_id) == before
    run = await info(store, done.run_id)
    assert (run.status, run.result) == (RunStatus.COMPLETED, "r")


async def test_renew_after_cancel_of_another_run_reports_only_that_run(store: Store) -> None:
    a = await running(store, now=T0)
    b = await running(store, now=T0)
    await store.cancel(b.run_id, now=T0 + 1)

    renewed = await store.renew(
        WORKER, {a.run_id: a.token, b.run_id: b.token}, now=T0 + 2, lock_ttl=TTL
    )

    assert renewed.cancel_requested == {b.run_id}
    assert renewed.lost == frozenset()


async def test_a_signal_to_an_earlier_run_of_a_chain_reaches_its_live_run(
    store: Store,
) -> None:
    """The live run of a continue_as_new chain takes over the chain's inbox: a signal (or
    a resume) sent to the start id, or to any earlier run id of the chain, is delivered to
    it, and queues it if it waits for that name."""
    first = await running(store, now=T0)
    second_id = await _continue(store, first.run_id, first.token, {"n": 2}, T0 + 1)
    [second] = await store.claim(WORKER, [WF], limit=1, now=T0 + 2, lock_ttl=TTL)
    third_id = await _continue(store, second_id, second.token, {"n": 3}, T0 + 3)
    [third] = await store.claim(WORKER, [WF], limit=1, now=T0 + 4, lock_ttl=TTL)
    assert third.run_id == third_id
    await wait_for(store, third_id, third.token, "go", now=T0 + 5)
    before = {rid: await journal(store, rid) for rid in (first.run_id, second_id)}

    await store.signal(second_id, "note", 1, now=T0 + 6)
    assert (await info(store, third_id)).status == RunStatus.WAITING
    await store.signal(first.run_id, "go", {"by": "ann"}, now=T0 + 7)

    assert (await info(store, third_id)).status == RunStatus.QUEUED
    received = [e for e in await journal(store, third_id)
                if e["type"] == EventType.SIGNAL_RECEIVED]
    assert [(e["name"], e["payload"]) for e in received] == [("note", 1), ("go", {"by": "ann"})]
    for rid, events in before.items():  # the earlier runs' journals stay as they ended
        assert await journal(store, rid) == events
        assert (await info(store, rid)).status == RunStatus.CONTINUED


async def test_a_signal_to_a_chain_whose_last_run_ended_is_refused(store: Store) -> None:
    first = await running(store, now=T0)
    second_id = await _continue(store, first.run_id, first.token, {"n": 2}, T0 + 1)
    [second] = await store.claim(WORKER, [WF], limit=1, now=T0 + 2, lock_ttl=TTL)
    await complete(store, second_id, second.token, now=T0 + 3)

    for rid in (first.run_id, second_id):
        with pytest.raises(RunNotActive, match="completed"):
            await store.signal(rid, "late", None, now=T0 + 4)
