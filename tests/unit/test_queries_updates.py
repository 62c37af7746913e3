"""Queries and updates in the engine: a query replays the journal and writes nothing; an
update is applied once, its outcome journaled and re-applied (not re-recorded) on replay."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from pyrula.workflows import (
    InlineWorkflowRunner,
    QueryFailed,
    RunNotActive,
    RunStatus,
    SyncWorkflowClient,
    UpdateFailed,
    WorkflowContext,
    WorkflowNotFound,
    step,
    workflow,
)
from pyrula.workflows.clock import ManualClock
from pyrula.workflows.events import UPDATE_SIGNAL
from tests.unit.journal import of_type

CALLS: list[str] = []


@step(name="qu.add")
def add(a: int, b: int) -> int:
    CALLS.append("add")
    return a + b


@workflow(name="qu.counter")
async def counter(ctx: WorkflowContext, params: dict[str, Any]) -> dict[str, Any]:
    state: dict[str, Any] = {"total": await add(params.get("start", 0), 0), "log": []}

    def increment(by: Any) -> int:
        if not isinstance(by, int) or by <= 0:
            raise ValueError(f"increment by a positive int, got {by!r}")
        state["total"] += by
        state["log"].append(by)
        return int(state["total"])

    ctx.set_query_handler("total", lambda: state["total"])
    ctx.set_query_handler("plus", lambda n: state["total"] + n)
    ctx.set_update_handler("increment", increment)
    await ctx.wait_for_signal("stop")
    state["total"] = await add(state["total"], 0)
    return state


async def _events(runner: InlineWorkflowRunner, run_id: str) -> list[dict[str, Any]]:
    return await runner.client.events(run_id)


async def _update(runner: InlineWorkflowRunner, run_id: str, name: str, payload: Any) -> Any:
    """Send an update and drive the run (inline) until its reply is read."""
    reply = asyncio.ensure_future(runner.client.update(run_id, name, payload, timeout=10))
    for _ in range(200):
        await asyncio.sleep(0.01)
        info = await runner.client.get(run_id)
        if info.status is RunStatus.QUEUED:
            await runner.run("qu.counter", run_id)
        if reply.done():
            break
    return await reply


async def test_query_replays_the_parked_run_and_writes_nothing(
    runner: InlineWorkflowRunner,
) -> None:
    run = await runner.client.submit("qu.counter", {"start": 5})
    await runner.run(run.name, run.run_id)
    assert (await runner.client.get(run.run_id)).status is RunStatus.WAITING
    before = await _events(runner, run.run_id)
    CALLS.clear()

    assert await runner.client.query(run.run_id, "total") == 5
    assert await runner.client.query(run.run_id, "plus", 3) == 8

    assert await _events(runner, run.run_id) == before  # no write
    assert CALLS == []  # the recorded step was not run again
    assert (await runner.client.get(run.run_id)).status is RunStatus.WAITING


async def test_query_errors_name_what_is_wrong(runner: InlineWorkflowRunner) -> None:
    run = await runner.client.submit("qu.counter", {"start": 1})
    await runner.run(run.name, run.run_id)
    with pytest.raises(QueryFailed, match="no query handler named 'nope'.*plus, total"):
        await runner.client.query(run.run_id, "nope")
    with pytest.raises(QueryFailed, match="TypeError"):
        await runner.client.query(run.run_id, "plus", "x")
    with pytest.raises(WorkflowNotFound, match="no run with id"):
        await runner.client.query("run-that-is-not", "total")

    other = await runner.client.submit("qu.not-imported-here")
    with pytest.raises(QueryFailed, match="'qu.not-imported-here' is not registered"):
        await runner.client.query(other.run_id, "total")

    await runner.client.signal(run.run_id, "stop")
    await runner.run(run.name, run.run_id)
    with pytest.raises(QueryFailed, match=r"ended \(completed\)"):
        await runner.client.query(run.run_id, "total")


async def test_update_reply_is_journaled_and_applied_once_on_replay(
    runner: InlineWorkflowRunner,
) -> None:
    run = await runner.client.submit("qu.counter", {"start": 10})
    await runner.run(run.name, run.run_id)
    info = await runner.client.get(run.run_id)
    assert UPDATE_SIGNAL in info.waiting_for

    assert await _update(runner, run.run_id, "increment", 2) == 12
    assert await _update(runner, run.run_id, "increment", 3) == 15
    assert await runner.client.query(run.run_id, "total") == 15

    await runner.client.signal(run.run_id, "stop")
    await runner.run(run.name, run.run_id)  # replays both updates, records neither again
    result = await runner.client.result(run.run_id, timeout=5)
    assert result == {"total": 15, "log": [2, 3]}
    applied = of_type(await _events(runner, run.run_id), "update:applied")
    assert [(e["name"], e["result"]) for e in applied] == [("increment", 12), ("increment", 15)]


async def test_update_failed_carries_the_handlers_error(runner: InlineWorkflowRunner) -> None:
    run = await runner.client.submit("qu.counter", {"start": 1})
    await runner.run(run.name, run.run_id)

    with pytest.raises(UpdateFailed, match="ValueError: increment by a positive int") as exc:
        await _update(runner, run.run_id, "increment", -1)
    assert (exc.value.error_type, exc.value.run_id) == ("ValueError", run.run_id)
    with pytest.raises(UpdateFailed, match="no update handler named 'reset'") as missing:
        await _update(runner, run.run_id, "reset", None)
    assert missing.value.error_type == "NoUpdateHandler"
    assert await runner.client.query(run.run_id, "total") == 1  # neither changed the state

    await runner.client.signal(run.run_id, "stop")
    await runner.run(run.name, run.run_id)
    with pytest.raises(RunNotActive, match="already ended"):
        await runner.client.update(run.run_id, "increment", 1, timeout=1)


async def test_update_times_out_naming_the_run_and_update(runner: InlineWorkflowRunner) -> None:
    run = await runner.client.submit("qu.counter", {"start": 1})
    await runner.run(run.name, run.run_id)  # parked; nobody runs it again
    with pytest.raises(TimeoutError, match=f"update 'increment' of run {run.run_id}"):
        await runner.client.update(run.run_id, "increment", 1, timeout=0.1)


@workflow(name="qu.sleeper")
async def sleeper(ctx: WorkflowContext, params: None) -> int:
    seen: list[int] = []
    ctx.set_update_handler("note", lambda n: seen.append(n) or len(seen))
    await ctx.sleep(3600)
    return sum(seen)


async def test_update_wakes_a_sleeping_run_which_sleeps_on(
    timed_runner: InlineWorkflowRunner, clock: ManualClock
) -> None:
    runner = timed_runner
    run = await runner.client.submit("qu.sleeper")
    await runner.run(run.name, run.run_id)
    parked = await runner.client.get(run.run_id)
    reply = asyncio.ensure_future(runner.client.update(run.run_id, "note", 4, timeout=10))
    for _ in range(100):
        await asyncio.sleep(0.01)
        if (await runner.client.get(run.run_id)).status is RunStatus.QUEUED:
            break
    await runner.run(run.name, run.run_id)
    assert await reply == 1
    again = await runner.client.get(run.run_id)
    assert again.wake_at == parked.wake_at  # the sleep goes on to its own time
    clock.advance(3600)
    assert await runner.store.wake_due(now=clock.now(), limit=10) == 1
    await runner.run(run.name, run.run_id)
    assert await runner.client.result(run.run_id, timeout=5) == 4


@workflow(name="qu.no_handlers")
async def no_handlers(ctx: WorkflowContext, params: None) -> None:
    await ctx.wait_for_signal("go")


async def test_update_of_a_parked_run_without_handlers_fails_at_once(
    runner: InlineWorkflowRunner,
) -> None:
    run = await runner.client.submit("qu.no_handlers")
    await runner.run(run.name, run.run_id)
    with pytest.raises(UpdateFailed, match="registered no update handler"):
        await runner.client.update(run.run_id, "x", 1, timeout=5)
    with pytest.raises(ValueError, match="reserved"):
        await runner.client.signal(run.run_id, UPDATE_SIGNAL, {})


def test_sync_client_queries_and_updates(runner: InlineWorkflowRunner) -> None:
    client = SyncWorkflowClient(runner.store)
    run = client.submit("qu.counter", {"start": 7})
    asyncio.run(runner.run(run.name, run.run_id))
    assert client.query(run.run_id, "total") == 7
    with pytest.raises(TimeoutError, match="no reply within"):
        client.update(run.run_id, "increment", 1, timeout=0.05)
    asyncio.run(runner.run(run.name, run.run_id))  # woken by the update: applies it
    assert client.query(run.run_id, "total") == 8
