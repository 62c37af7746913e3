"""Store contract: every write of an attempt is fenced by its token.

A write with a stale token raises StaleToken and changes nothing: not the journal, not
the status, not the lock of the attempt that holds the run now.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from pyrula.workflows.errors import StaleToken, WorkflowNotFound
from pyrula.workflows.events import EventType
from pyrula.workflows.records import RunStatus
from pyrula.workflows.stores.base import Store
from tests.conformance.support import (
    T0,
    TTL,
    complete,
    ev,
    info,
    journal,
    orphan,
    running,
    sleep,
    take,
    types,
)

Write = Callable[[Store, str, int, float], Awaitable[Any]]


async def _append(store: Store, run_id: str, token: int, now: float) -> Any:
    return await store.append(
        run_id, token, [ev(EventType.STEP_STARTED, now, step="s", call=1)], now=now, lock_ttl=TTL
    )


async def _park(store: Store, run_id: str, token: int, now: float) -> Any:
    return await store.park(
        run_id, token, [ev(EventType.RUN_SLEEPING, now, wake_at=now + 60)],
        now=now, wake_at=now + 60, signals=[], known_seq=0,
    )


async def _finish(store: Store, run_id: str, token: int, now: float) -> Any:
    return await store.finish(
        run_id, token, [ev(EventType.RUN_COMPLETED, now, result="late")],
        now=now, status=RunStatus.COMPLETED, result="late",
    )


async def _fail(store: Store, run_id: str, token: int, now: float) -> Any:
    error = {"code": "workflow_error", "error_type": "X", "message": "late"}
    return await store.finish(
        run_id, token, [ev(EventType.RUN_ERROR, now, **error)],
        now=now, status=RunStatus.FAILED, error=error,
    )


async def _requeue(store: Store, run_id: str, token: int, now: float) -> Any:
    return await store.requeue(
        run_id, token, now=now, reason="shutdown",
        events=[ev(EventType.STEP_STARTED, now, step="s", call=1)],
    )


async def _crash(store: Store, run_id: str, token: int, now: float) -> Any:
    return await store.requeue(run_id, token, now=now, reason="loop_blocked", crash=True)


WRITES: dict[str, Write] = {
    "append": _append,
    "park": _park,
    "finish": _finish,
    "finish-failed": _fail,
    "requeue": _requeue,
    "requeue-crash": _crash,
}
parametrize_writes = pytest.mark.parametrize("write", list(WRITES.values()), ids=list(WRITES))


@parametrize_writes
async def test_a_write_to_a_run_the_store_does_not_know_is_not_found(store: Store,
                                                                   write: Write) -> None:
    # An id of the store's own making (shard and all) that it never handed out: what an
    # attempt meets when a failover lost the run under it. It must not read as an outage,
    # which the worker would retry for ever.
    known = await running(store, now=T0)
    tail = "0000" if not known.run_id.endswith("0000") else "1111"
    missing = known.run_id[:-4] + tail
    with pytest.raises(WorkflowNotFound):
        await write(store, missing, known.token, T0 + 1)
    assert (await info(store, known.run_id)).status == RunStatus.RUNNING


@parametrize_writes
async def test_a_reclaimed_attempt_cannot_write(store: Store, write: Write) -> None:
    old = await running(store, now=T0, worker="w1")
    await orphan(store, old.run_id, now=T0 + TTL + 1)
    new = await take(store, old.run_id, now=T0 + TTL + 2, worker="w2")
    before = await journal(store, old.run_id)

    with pytest.raises(StaleToken):
        await write(store, old.run_id, old.token, T0 + TTL + 3)

    assert await journal(store, old.run_id) == before
    run = await info(store, old.run_id)
    assert (run.status, run.attempt) == (RunStatus.RUNNING, new.token)
    # The current attempt is untouched and still writes.
    appended = await _append(store, new.run_id, new.token, T0 + TTL + 4)
    assert appended.last_seq == len(before) + 1


@parametrize_writes
async def test_a_requeued_attempt_cannot_write(store: Store, write: Write) -> None:
    old = await running(store, now=T0)
    await store.requeue(old.run_id, old.token, now=T0 + 1, reason="shutdown")
    before = await journal(store, old.run_id)

    with pytest.raises(StaleToken):
        await write(store, old.run_id, old.token, T0 + 2)

    assert await journal(store, old.run_id) == before
    assert (await info(store, old.run_id)).status == RunStatus.QUEUED


@parametrize_writes
async def test_a_finished_run_refuses_every_write(store: Store, write: Write) -> None:
    claimed = await running(store, now=T0)
    await complete(store, claimed.run_id, claimed.token, "first", now=T0 + 1)
    before = await journal(store, claimed.run_id)

    with pytest.raises(StaleToken):
        await write(store, claimed.run_id, claimed.token, T0 + 2)

    assert await journal(store, claimed.run_id) == before
    run = await info(store, claimed.run_id)
    assert (run.status, run.result) == (RunStatus.COMPLETED, "first")


@parametrize_writes
async def test_a_parked_attempt_cannot_write(store: Store, write: Write) -> None:
    claimed = await running(store, now=T0)
    await sleep(store, claimed.run_id, claimed.token, T0 + 600, now=T0 + 1)
    before = await journal(store, claimed.run_id)

    with pytest.raises(StaleToken):
        await write(store, claimed.run_id, claimed.token, T0 + 2)

    assert await journal(store, claimed.run_id) == before
    assert (await info(store, claimed.run_id)).status == RunStatus.SLEEPING


@parametrize_writes
async def test_a_token_from_the_future_is_refused(store: Store, write: Write) -> None:
    claimed = await running(store, now=T0)

    with pytest.raises(StaleToken):
        await write(store, claimed.run_id, claimed.token + 1, T0 + 1)

    assert types(await journal(store, claimed.run_id)) == [
        EventType.RUN_SUBMITTED, EventType.RUN_STARTED
    ]
    assert (await info(store, claimed.run_id)).status == RunStatus.RUNNING


async def test_a_stale_write_leaves_the_lock_of_the_current_attempt(store: Store) -> None:
    """A refused append must not renew the lock as a successful one does."""
    old = await running(store, now=T0, ttl=10.0)
    await orphan(store, old.run_id, now=T0 + 11)
    await take(store, old.run_id, now=T0 + 11, worker="w2", ttl=10.0)  # until T0 + 21

    with pytest.raises(StaleToken):
        await store.append(
            old.run_id, old.token, [ev(EventType.STEP_STARTED, T0 + 20, step="s", call=1)],
            now=T0 + 20, lock_ttl=100.0,
        )

    await orphan(store, old.run_id, now=T0 + 22)
