"""Child workflows with a real WorkflowWorker on every store: a parent completes with its
children's results, a child's failure is raised in it, a cancel cascades, a lost nudge is
found by the re-check; and a Hypothesis fan-out drawing the children, the limit and which
of them fail."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyrula.workflows import (
    ChildFailed,
    MemoryStore,
    RunStatus,
    SQLiteStore,
    WorkerOptions,
    WorkflowClient,
    WorkflowContext,
    WorkflowWorker,
    workflow,
)
from tests.conftest import await_until


@workflow(name="cf.square")
async def square(ctx: WorkflowContext, params: int) -> int:
    return params * params


@workflow(name="cf.boom")
async def boom(ctx: WorkflowContext, params: Any) -> None:
    raise RuntimeError(f"boom {params}")


@workflow(name="cf.hold")
async def hold(ctx: WorkflowContext, params: Any) -> Any:
    return await ctx.wait_for_signal("go")


@workflow(name="cf.parent")
async def parent(ctx: WorkflowContext, params: int) -> dict[str, Any]:
    one = await ctx.child(square, params)
    many = await ctx.gather_children([(square, i) for i in range(params)], max_concurrency=3)
    try:
        await ctx.child(boom, "x")
    except ChildFailed as exc:
        failed = [exc.run_id, exc.error_type, exc.message]
    return {"one": one, "many": many, "failed": failed}


@workflow(name="cf.fan")
async def fan(ctx: WorkflowContext, params: dict[str, Any]) -> Any:
    specs = [("cf.boom" if i in params["fail"] else "cf.square", i) for i in range(params["n"])]
    try:
        return await ctx.gather_children(specs, max_concurrency=params["limit"])
    except ChildFailed as exc:
        return {"failed": exc.message}


@workflow(name="cf.holder")
async def holder(ctx: WorkflowContext, params: Any) -> Any:
    gone = await ctx.start_child(hold, "gone")
    kept = await ctx.start_child(hold, "kept", on_parent_cancel="abandon")
    return [await gone, await kept]


WORKFLOWS = [square, boom, hold, parent, fan, holder]
OPTIONS = {"claim_poll_interval": 0.01, "timer_poll_interval_s": 0.05, "lock_ttl": 2.0,
           "shutdown_grace": 2.0, "cancel_timeout": 1.0, "max_concurrent_runs": 8}


@asynccontextmanager
async def serving(store: Any, **options: Any) -> AsyncIterator[WorkflowClient]:
    worker = WorkflowWorker(store=store, workflows=WORKFLOWS, cloud=False,
                            options=WorkerOptions(**{**OPTIONS, **options}))
    task = asyncio.create_task(worker.run())
    try:
        yield WorkflowClient(store)
    finally:
        worker.stop()
        await asyncio.wait_for(task, 30)


async def children(client: WorkflowClient, run_id: str) -> list[Any]:
    return [i async for i in client.list_runs(limit=10_000) if i.parent_id == run_id]


async def test_a_parent_completes_with_its_childrens_results(store: Any) -> None:
    async with serving(store) as client:
        run = await client.submit("cf.parent", 4)
        result = await client.result(run.run_id, timeout=60)
        kids = await children(client, run.run_id)
    (failed,) = [k for k in kids if k.name == "cf.boom"]
    assert result == {"one": 16, "many": [0, 1, 4, 9],
                      "failed": [failed.run_id, "RuntimeError", "boom x"]}
    assert len(kids) == 6  # each started once


async def test_cancelling_a_parent_cancels_its_children(store: Any) -> None:
    async with serving(store) as client:
        run = await client.submit("cf.holder", None)

        async def both_waiting() -> bool:
            kids = await children(client, run.run_id)
            return len(kids) == 2 and all(k.status is RunStatus.WAITING for k in kids)

        await await_until(both_waiting, timeout=30, what="both children waiting")
        await await_until(
            lambda: _status_is(client, run.run_id, RunStatus.WAITING), timeout=30,
            what="parent parked",
        )
        assert await client.cancel(run.run_id)
        kids = {k.params: k for k in await children(client, run.run_id)}
        assert kids["gone"].status is RunStatus.CANCELLED
        assert kids["kept"].status is RunStatus.WAITING
        await client.signal(kids["kept"].run_id, "go", 1)
        assert await client.result(kids["kept"].run_id, timeout=30) == 1


async def _status_is(client: WorkflowClient, run_id: str, status: RunStatus) -> bool:
    return (await client.get(run_id)).status is status


async def test_a_lost_nudge_is_found_by_the_re_check(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def lost(*args: Any, **kwargs: Any) -> None:
        return None

    monkeypatch.setattr("pyrula.workflows.engine.nudge_parent", lost)
    async with serving(store, child_recheck=1.0) as client:
        run = await client.submit("cf.parent", 2)
        result = await client.result(run.run_id, timeout=60)
    assert result["many"] == [0, 1]


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
@settings(max_examples=10, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(0, 9), limit=st.integers(1, 4), data=st.data())
def test_gather_children_drawn(backend: str, tmp_path: Path, n: int, limit: int,
                               data: st.DataObject) -> None:
    """Any number of children, any limit, any of them failing: each child starts once, the
    results come in order, or the first failure in order is raised."""
    fail = data.draw(st.sets(st.integers(0, n - 1), max_size=n)) if n else set()
    store: Any = (MemoryStore() if backend == "memory"
                  else SQLiteStore(str(tmp_path / f"{uuid.uuid4().hex}.db")))
    try:
        result, kids = asyncio.run(_fan_out(store, n, limit, sorted(fail)))
    finally:
        store.close()
    assert len(kids) == n and len({k.run_id for k in kids}) == n
    if fail:
        assert result == {"failed": f"boom {min(fail)}"}
    else:
        assert result == [i * i for i in range(n)]


async def _fan_out(store: Any, n: int, limit: int, fail: list[int]) -> tuple[Any, list[Any]]:
    async with serving(store) as client:
        run = await client.submit("cf.fan", {"n": n, "limit": limit, "fail": fail})
        result = await client.result(run.run_id, timeout=60)
        return result, await children(client, run.run_id)
