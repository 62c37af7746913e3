"""Store contract: one store object serves the event loop and other threads at once."""

from __future__ import annotations

import asyncio
import time

from pyrula.workflows.client import SyncWorkflowClient
from pyrula.workflows.clock import ManualClock
from pyrula.workflows.records import RunStatus
from pyrula.workflows.stores.base import Store
from tests.conformance.support import T0, TTL, WF, WORKER, complete, info, running, submit

#: Bounds a hang, never a speed: every wait below ends as soon as its condition holds.
DEADLINE = 10.0


def _client(store: Store) -> SyncWorkflowClient:
    return SyncWorkflowClient(store, clock=ManualClock(T0))


async def test_a_thread_submits_while_the_loop_claims(store: Store) -> None:
    client = _client(store)
    count = 30

    def submit_all() -> list[str]:
        return [client.submit(WF, {"i": i}, owner="threaded").run_id for i in range(count)]

    submitter = asyncio.create_task(asyncio.to_thread(submit_all))
    claimed: list[str] = []
    deadline = time.monotonic() + DEADLINE
    while len(claimed) < count:
        assert time.monotonic() < deadline, f"claimed {len(claimed)} of {count}"
        batch = await store.claim(WORKER, [WF], limit=7, now=T0, lock_ttl=TTL)
        claimed += [c.run_id for c in batch]
        if not batch:
            await asyncio.sleep(0.005)  # poll: the thread has not submitted more yet

    submitted = await asyncio.wait_for(submitter, DEADLINE)
    assert len(set(claimed)) == len(claimed) == count
    assert set(claimed) == set(submitted)
    assert await store.claim(WORKER, [WF], limit=7, now=T0, lock_ttl=TTL) == []


async def test_threads_racing_on_one_idempotency_key_create_one_run(store: Store) -> None:
    client = _client(store)

    handles = await asyncio.gather(
        *(asyncio.to_thread(client.submit, WF, {"i": i}, idempotency_key="once") for i in range(8)),
        store.submit(WF, {"i": "loop"}, now=T0, idempotency_key="once"),
    )

    run_ids = {h.run_id for h in handles[:-1]} | {handles[-1][0].run_id}
    assert len(run_ids) == 1
    assert len(await store.list_runs(name=WF)) == 1


async def test_a_cancel_from_a_thread_wakes_a_waiter_on_the_loop(store: Store) -> None:
    run_id = await submit(store, now=T0)
    waiter = asyncio.create_task(store.wait_result(run_id, timeout=None))
    await asyncio.sleep(0)

    assert await asyncio.to_thread(_client(store).cancel, run_id) is True

    run = await asyncio.wait_for(waiter, DEADLINE)
    assert run.status == RunStatus.CANCELLED


async def test_a_thread_waiting_on_result_is_woken_by_a_finish_on_the_loop(store: Store) -> None:
    claimed = await running(store, now=T0)
    waiter = asyncio.create_task(
        asyncio.to_thread(_client(store).result, claimed.run_id, DEADLINE)
    )
    for _ in range(5):
        await asyncio.sleep(0)
    assert not waiter.done()

    await complete(store, claimed.run_id, claimed.token, {"answer": 42}, now=T0 + 1)

    assert await asyncio.wait_for(waiter, DEADLINE) == {"answer": 42}
    assert (await info(store, claimed.run_id)).status == RunStatus.COMPLETED
