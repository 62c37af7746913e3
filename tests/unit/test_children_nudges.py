"""A child that ends without an attempt of its own (cancelled by a client while parked,
failed as stranded) nudges its parent, which wakes at once rather than at its re-check
timer; on every store, with a real WorkflowWorker. The nudge writes nothing in the
parent's journal: a parent woken by its timer would show a ``run:woken``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from pyrula.workflows import (
    ChildFailed,
    RunStatus,
    WorkerOptions,
    WorkflowClient,
    WorkflowContext,
    WorkflowWorker,
    workflow,
)
from pyrula.workflows.events import CHILD_SIGNAL, child_key
from pyrula.workflows.family import nudge_parents_of
from tests.conftest import await_until


@workflow(name="nudge.hold")
async def hold(ctx: WorkflowContext, params: Any) -> Any:
    return await ctx.wait_for_signal("go")


@workflow(name="nudge.parent")
async def parent(ctx: WorkflowContext, params: str) -> Any:
    try:
        return await ctx.child(params, None)
    except ChildFailed as exc:
        return {"status": exc.status, "type": exc.error_type}


@asynccontextmanager
async def serving(store: Any, **options: Any) -> AsyncIterator[WorkflowClient]:
    worker = WorkflowWorker(store=store, workflows=[hold, parent], cloud=False,
                            options=WorkerOptions(claim_poll_interval=0.01,
                                                  orphan_scan_interval=0.05,
                                                  child_recheck=60.0, **options))
    task = asyncio.create_task(worker.run())
    try:
        yield WorkflowClient(store)
    finally:
        worker.stop()
        await asyncio.wait_for(task, 30)


async def _parked_child(client: WorkflowClient, parent_id: str) -> str:
    async def child() -> str | None:
        kids = [i async for i in client.list_runs() if i.parent_id == parent_id]
        parked = (await client.get(parent_id)).status is RunStatus.WAITING
        return kids[0].run_id if kids and parked else None

    found: str = await await_until(child, timeout=10, what="the parent parked on its child")
    return found


async def _nudges(client: WorkflowClient, run_id: str) -> list[Any]:
    """Nudges written as signals (as an older pyrula did): none now."""
    return [e["payload"]["child"] for e in await client.events(run_id)
            if e["type"] == "signal:received" and e.get("name") == CHILD_SIGNAL]


async def _timer_wakes(client: WorkflowClient, run_id: str) -> list[Any]:
    return [e for e in await client.events(run_id) if e["type"] == "run:woken"]


async def test_a_child_cancelled_while_parked_wakes_its_parent_at_once(store: Any) -> None:
    async with serving(store) as client:
        run = await client.submit(parent, "nudge.hold")
        child = await _parked_child(client, run.run_id)
        assert await client.cancel(child)
        result = await client.result(run.run_id, timeout=10)
        assert result == {"status": "cancelled", "type": "RunCancelled"}
        assert await _timer_wakes(client, run.run_id) == []  # woken by the nudge
        assert await _nudges(client, run.run_id) == []  # which wrote nothing


async def test_a_child_failed_as_stranded_wakes_its_parent(store: Any) -> None:
    async with serving(store, stranded_policy="fail", stranded_timeout=0.01) as client:
        run = await client.submit(parent, "nudge.nobody_serves_this")
        result = await client.result(run.run_id, timeout=10)
        assert result["status"] == "failed"
        kids = [i.run_id async for i in client.list_runs() if i.parent_id == run.run_id]
        assert len(kids) == 1
        assert await _timer_wakes(client, run.run_id) == []
        assert await _nudges(client, run.run_id) == []


async def test_nudge_parents_of_passes_over_live_runs_and_runs_with_no_parent(
        store: Any) -> None:
    client = WorkflowClient(store)
    alone = await client.submit(hold, None)
    await nudge_parents_of(store, [alone.run_id, "no-such-run"], now=time.time())
    assert (await client.get(alone.run_id)).status is RunStatus.QUEUED


async def test_a_parent_already_queued_is_left_queued(store: Any) -> None:
    """A queued parent's next attempt looks at its children after their ends were
    written: the nudge leaves it as it is."""
    client = WorkflowClient(store)
    queued = await client.submit(parent, "nudge.hold")  # no worker: it stays queued
    child = await client.submit(hold, None,
                                idempotency_key=child_key(queued.run_id, "call:1"))
    assert (await client.get(child.run_id)).parent_id == queued.run_id
    assert await client.cancel(child.run_id)

    await nudge_parents_of(store, [child.run_id], now=time.time())

    assert (await client.get(queued.run_id)).status is RunStatus.QUEUED
    assert await _nudges(client, queued.run_id) == []
