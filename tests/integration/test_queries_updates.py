"""Queries and updates with a real WorkflowWorker, on every store: a query of a parked
run answers from a replay on the caller; an update wakes a waiting or sleeping run, which
applies it and journals the reply the client reads back; a refused update fails clearly."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from pyrula.workflows import (
    QueryFailed,
    RunStatus,
    UpdateFailed,
    WorkflowClient,
    WorkflowContext,
    step,
    workflow,
)
from pyrula.workflows.events import UPDATE_SIGNAL
from tests.conftest import await_until
from tests.integration.valkey_support import make_worker, serving


@step(name="qui.double")
def double(x: int) -> int:
    return 2 * x


@workflow(name="qui.cart")
async def cart(ctx: WorkflowContext, params: dict[str, Any]) -> dict[str, Any]:
    items: list[str] = []
    budget = await double(params["budget"])

    def add_item(item: Any) -> int:
        if not isinstance(item, str) or not item:
            raise ValueError(f"an item is a non-empty str, got {item!r}")
        if len(items) >= budget:
            raise OverflowError(f"the cart holds at most {budget} items")
        items.append(item)
        return len(items)

    ctx.set_query_handler("items", lambda: list(items))
    ctx.set_query_handler("budget", lambda: budget)
    ctx.set_update_handler("add", add_item)
    await ctx.wait_for_signal("checkout")
    return {"items": items}


@workflow(name="qui.nap")
async def nap(ctx: WorkflowContext, params: None) -> list[Any]:
    notes: list[Any] = []
    ctx.set_query_handler("notes", lambda: notes)
    ctx.set_update_handler("note", lambda n: notes.append(n) or len(notes))
    await ctx.sleep(3600)
    return notes


async def _parked(client: WorkflowClient, run_id: str, status: RunStatus) -> None:
    async def check() -> bool:
        info = await client.get(run_id)
        return info.status is status and UPDATE_SIGNAL in info.waiting_for

    await await_until(check, timeout=20, what=f"run {run_id} to park {status.value}")


async def test_query_and_update_a_waiting_run(store: Any) -> None:
    client = WorkflowClient(store)
    async with serving(make_worker(store, [cart, nap])):
        run = await client.submit(cart, {"budget": 1})
        await _parked(client, run.run_id, RunStatus.WAITING)
        journal = await client.events(run.run_id)

        assert await client.query(run.run_id, "budget") == 2
        assert await client.query(run.run_id, "items") == []
        assert await client.events(run.run_id) == journal  # a query writes nothing

        assert await client.update(run.run_id, "add", "apple", timeout=20) == 1
        assert await client.update(run.run_id, "add", "pear", timeout=20) == 2
        assert await client.query(run.run_id, "items") == ["apple", "pear"]

        with pytest.raises(UpdateFailed, match="at most 2 items") as full:
            await client.update(run.run_id, "add", "plum", timeout=20)
        assert full.value.error_type == "OverflowError"
        with pytest.raises(UpdateFailed, match="no update handler named 'remove'"):
            await client.update(run.run_id, "remove", "apple", timeout=20)

        await _parked(client, run.run_id, RunStatus.WAITING)
        await client.signal(run.run_id, "checkout")
        assert await client.result(run.run_id, timeout=20) == {"items": ["apple", "pear"]}
        with pytest.raises(QueryFailed, match="ended"):
            await client.query(run.run_id, "items")
    applied = [e for e in await client.events(run.run_id) if e["type"] == "update:applied"]
    assert [e.get("result", e.get("error_type")) for e in applied] == [
        1, 2, "OverflowError", "NoUpdateHandler",
    ]


async def test_update_wakes_a_sleeping_run_and_queries_see_it(store: Any) -> None:
    client = WorkflowClient(store)
    async with serving(make_worker(store, [cart, nap])):
        run = await client.submit(nap)
        await _parked(client, run.run_id, RunStatus.WAITING)
        wake_at = (await client.get(run.run_id)).wake_at
        assert wake_at is not None

        replies = await asyncio.gather(
            *(client.update(run.run_id, "note", n, timeout=20) for n in ("a", "b", "c"))
        )
        assert sorted(replies) == [1, 2, 3]
        notes = await client.query(run.run_id, "notes")
        assert sorted(notes) == ["a", "b", "c"]
        await _parked(client, run.run_id, RunStatus.WAITING)
        assert (await client.get(run.run_id)).wake_at == wake_at  # it sleeps on
        # Each reply is the count after its own update: the order they were applied in.
        assert [notes.index(n) + 1 for n in ("a", "b", "c")] == replies
        await client.cancel(run.run_id)
