"""The engine: deterministic values, continue_as_new, cancel, timeouts, non-determinism."""

from __future__ import annotations

import asyncio
import gc
import logging
from typing import Any

import pytest

from pyrula.workflows import (
    InlineWorkflowRunner,
    RunCancelled,
    RunFailed,
    RunStatus,
    WorkflowContext,
    step,
    workflow,
)
from pyrula.workflows.clock import ManualClock
from tests.unit.journal import last, step_names, types

SEEN: list[Any] = []


@pytest.fixture(autouse=True)
def _reset() -> None:
    SEEN.clear()


@workflow(name="engine.values")
async def values(ctx: WorkflowContext, params: None) -> dict[str, Any]:
    SEEN.append(ctx.is_replaying)
    now, uid, rnd = ctx.now(), ctx.uuid4(), ctx.random()
    SEEN.append((now, uid, rnd, ctx.attempt, ctx.is_replaying))
    await ctx.sleep(60)
    SEEN.append(ctx.is_replaying)
    return {"now": now.isoformat(), "uuid": str(uid), "random": rnd}


async def test_now_uuid4_and_random_are_the_same_on_replay(
    store_runner: InlineWorkflowRunner,
) -> None:
    runner = store_runner
    run = await runner.client.submit("engine.values")
    events = await runner.run(run.name, run.run_id)
    assert step_names(events) == ["pyrula.now", "pyrula.uuid4", "pyrula.random"]

    await runner.client.wake(run.run_id)
    await runner.run(run.name, run.run_id)

    fresh_start, first, replay_start, again, after_sleep = SEEN
    (first_now, first_uuid, first_random, first_attempt, first_replaying) = first
    (again_now, again_uuid, again_random, again_attempt, again_replaying) = again
    assert (again_now, again_uuid, again_random) == (first_now, first_uuid, first_random)
    assert first_now.tzinfo is not None
    assert 0.0 <= first_random < 1.0
    assert (first_attempt, again_attempt) == (1, 2)
    # is_replaying: a new run is live from its first line; a resumed one replays what
    # the journal holds and is live again past its last recorded operation.
    assert (fresh_start, first_replaying) == (False, False)
    assert (replay_start, again_replaying) == (True, True)
    assert after_sleep is False
    result = await runner.client.result(run.run_id, timeout=5)
    assert result == {
        "now": first_now.isoformat(), "uuid": str(first_uuid), "random": first_random
    }


@workflow(name="engine.context")
async def context_info(ctx: WorkflowContext, params: None) -> dict[str, Any]:
    return {
        "run_id": ctx.run_id, "workflow_name": ctx.workflow_name, "owner": ctx.owner,
        "attempt": ctx.attempt, "start_id": ctx.start_id,
    }


async def test_context_describes_the_run(runner: InlineWorkflowRunner) -> None:
    run = await runner.client.submit("engine.context", owner="tenant-1")
    await runner.run(run.name, run.run_id)
    assert await runner.client.result(run.run_id, timeout=5) == {
        "run_id": run.run_id, "workflow_name": "engine.context", "owner": "tenant-1",
        "attempt": 1, "start_id": run.run_id,
    }


@step
def tick(n: int) -> int:
    SEEN.append(n)
    return n


@workflow(name="engine.countdown")
async def countdown(ctx: WorkflowContext, params: dict[str, int]) -> str:
    await tick(params["n"])
    if params["n"] > 0:
        ctx.continue_as_new({"n": params["n"] - 1})
    return f"done after {len(SEEN)} ticks"


async def test_continue_as_new_chains_runs(store_runner: InlineWorkflowRunner) -> None:
    runner = store_runner
    first = await runner.client.submit("engine.countdown", {"n": 2}, owner="tenant-7")
    events = await runner.run(first.name, first.run_id)

    info = await runner.client.get(first.run_id)
    assert info.status is RunStatus.CONTINUED
    continued = last(events, "run:continued")
    assert types(events)[-1] == "run:continued"
    assert continued["ts"] >= events[-2]["ts"], "stamped when the run continued"
    successor = continued["successor"]
    assert info.successor_id == successor
    nxt = await runner.client.get(successor)
    assert nxt.status is RunStatus.QUEUED
    assert nxt.params == {"n": 1}
    assert nxt.start_id == first.run_id
    assert nxt.owner == "tenant-7"
    assert nxt.name == "engine.countdown"

    while await runner.run_next() is not None:
        pass

    assert await runner.client.result(first.run_id, timeout=5) == "done after 3 ticks"
    assert SEEN == [2, 1, 0]
    runs = [info async for info in runner.client.list_runs(name="engine.countdown")]
    assert sorted(r.status.value for r in runs) == ["completed", "continued", "continued"]
    assert {r.start_id for r in runs} == {first.run_id}


@workflow(name="engine.swallow_continue")
async def swallow_continue(ctx: WorkflowContext, params: int) -> str:
    try:
        if params:
            ctx.continue_as_new(0)
    except Exception:  # continue_as_new is engine control flow, not an Exception
        return "swallowed"
    return "second run"


async def test_continue_as_new_cannot_be_swallowed_by_except_exception(
    runner: InlineWorkflowRunner,
) -> None:
    run = await runner.client.submit("engine.swallow_continue", 1)
    await runner.run(run.name, run.run_id)
    assert (await runner.client.get(run.run_id)).status is RunStatus.CONTINUED
    await runner.run_next()
    assert await runner.client.result(run.run_id, timeout=5) == "second run"


@workflow(name="engine.sleeper")
async def sleeper(ctx: WorkflowContext, params: None) -> str:
    await ctx.sleep(3600)
    return "woke"


async def test_cancel_a_queued_run(store_runner: InlineWorkflowRunner) -> None:
    runner = store_runner
    run = await runner.client.submit("engine.sleeper")
    assert await runner.client.cancel(run.run_id) is True

    info = await runner.client.get(run.run_id)
    assert info.status is RunStatus.CANCELLED
    assert types(await runner.client.events(run.run_id))[-1] == "run:cancelled"
    with pytest.raises(RunCancelled):
        await runner.client.result(run.run_id, timeout=5)
    assert await runner.run_next() is None, "a cancelled run is no longer queued"
    assert await runner.client.cancel(run.run_id) is False


async def test_cancel_a_sleeping_run(store_runner: InlineWorkflowRunner) -> None:
    runner = store_runner
    run = await runner.client.submit("engine.sleeper")
    await runner.run(run.name, run.run_id)
    assert (await runner.client.get(run.run_id)).status is RunStatus.SLEEPING

    assert await runner.client.cancel(run.run_id) is True

    assert (await runner.client.get(run.run_id)).status is RunStatus.CANCELLED
    with pytest.raises(RunCancelled):
        await runner.client.result(run.run_id, timeout=5)
    assert await runner.store.wake_due(now=1e12, limit=100) == 0


#: The client a step uses to cancel its own run, by run id (step arguments are JSON).
CLIENTS: dict[str, Any] = {}


@step
async def cancel_myself(run_id: str) -> str:
    await CLIENTS[run_id].cancel(run_id)
    return "asked"


@workflow(name="engine.cancel_while_running")
async def cancel_while_running(ctx: WorkflowContext, params: None) -> str:
    try:
        await cancel_myself(ctx.run_id)
        SEEN.append("after the step")
        await tick(1)
    finally:
        await tick(2)
    return "not cancelled"


async def test_cancel_a_running_run_takes_effect_at_the_next_boundary(
    runner: InlineWorkflowRunner,
) -> None:
    run = await runner.client.submit("engine.cancel_while_running")
    CLIENTS[run.run_id] = runner.client
    try:
        events = await runner.run(run.name, run.run_id)
    finally:
        CLIENTS.pop(run.run_id)

    assert (await runner.client.get(run.run_id)).status is RunStatus.CANCELLED
    assert types(events)[-1] == "run:cancelled"
    assert events[-1]["ts"] >= events[-2]["ts"], "stamped when the cancel took effect"
    assert step_names(events) == [cancel_myself.__qualname__]
    assert 1 not in SEEN, "no step may start after the cancel was seen"
    assert 2 not in SEEN, "nor in a finally block while the cancelled run unwinds"


@step(name="engine.cleanup")
def cleanup() -> str:
    SEEN.append("cleanup")
    return "cleaned"


@workflow(name="engine.finally")
async def with_finally(ctx: WorkflowContext, params: None) -> str:
    try:
        await ctx.sleep(60)
    finally:
        await cleanup()
        await ctx.sleep(1)
    return "done"


async def test_a_finally_block_starts_nothing_when_the_run_parks(
    runner: InlineWorkflowRunner, caplog: pytest.LogCaptureFixture
) -> None:
    run = await runner.client.submit("engine.finally")
    events = await runner.run(run.name, run.run_id)

    # Parking unwinds the workflow code, but a step there would run unjournaled on
    # every park: the engine refuses it.
    assert SEEN == []
    assert types(events)[-1] == "run:sleeping"
    assert (await runner.client.get(run.run_id)).status is RunStatus.SLEEPING
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]

    await runner.client.wake(run.run_id)
    await runner.run(run.name, run.run_id)
    await runner.client.wake(run.run_id)
    events = await runner.run(run.name, run.run_id)

    assert await runner.client.result(run.run_id, timeout=5) == "done"
    assert SEEN == ["cleanup"]
    assert step_names(events) == ["engine.cleanup"]


@workflow(name="engine.slow_timeout", timeout=60)
async def slow_timeout(ctx: WorkflowContext, params: None) -> str:
    await ctx.sleep(3600)
    return "too late"


async def test_workflow_timeout_fails_a_parked_run(
    timed_runner: InlineWorkflowRunner, clock: ManualClock
) -> None:
    runner = timed_runner
    run = await runner.client.submit("engine.slow_timeout")
    await runner.run(run.name, run.run_id)
    info = await runner.client.get(run.run_id)
    assert info.status is RunStatus.SLEEPING
    assert info.wake_at == clock.now() + 60, "the deadline wakes the run before its sleep"

    clock.advance(61)
    assert await runner.store.wake_due(now=clock.now(), limit=100) == 1
    events = await runner.run(run.name, run.run_id)

    error = last(events, "run:error")
    assert error["code"] == "timeout"
    assert error["error_type"] == "TimeoutError"
    with pytest.raises(RunFailed) as raised:
        await runner.client.result(run.run_id, timeout=5)
    assert raised.value.error["code"] == "timeout"


async def test_workflow_timeout_counts_from_the_first_start_not_the_submit(
    timed_runner: InlineWorkflowRunner, clock: ManualClock
) -> None:
    runner = timed_runner
    run = await runner.client.submit("engine.slow_timeout")
    clock.advance(30)  # queued for 30 s before a worker starts it
    started = clock.now()
    await runner.run(run.name, run.run_id)
    assert (await runner.client.get(run.run_id)).wake_at == started + 60


@workflow(name="engine.sleep_until_now")
async def sleep_until_now(ctx: WorkflowContext, params: None) -> str:
    await ctx.sleep_until(ctx.now())
    await ctx.sleep(0)
    return "on time"


async def test_a_sleep_until_a_time_that_has_come_does_not_park(
    timed_runner: InlineWorkflowRunner, clock: ManualClock
) -> None:
    runner = timed_runner
    run = await runner.client.submit("engine.sleep_until_now")
    events = await runner.run(run.name, run.run_id)
    assert await runner.client.result(run.run_id, timeout=5) == "on time"
    assert "run:sleeping" not in types(events)
    assert (events[-1]["type"], events[-1]["ts"]) == ("run:completed", clock.now())


@step
async def long_step() -> str:
    await asyncio.sleep(30)
    return "done"


@workflow(name="engine.busy_timeout", timeout=0.1)
async def busy_timeout(ctx: WorkflowContext, params: None) -> str:
    return str(await long_step())


async def test_workflow_timeout_stops_a_run_busy_in_a_step(runner: InlineWorkflowRunner) -> None:
    run = await runner.client.submit("engine.busy_timeout")
    events = await runner.run(run.name, run.run_id)
    assert last(events, "run:error")["code"] == "timeout"
    assert (await runner.client.get(run.run_id)).status is RunStatus.FAILED


@workflow(name="engine.raises")
async def raises(ctx: WorkflowContext, params: None) -> None:
    raise KeyError("missing")


async def test_a_workflow_that_raises_fails_the_run(runner: InlineWorkflowRunner) -> None:
    run = await runner.client.submit("engine.raises")
    await runner.run(run.name, run.run_id)
    with pytest.raises(RunFailed) as raised:
        await runner.client.result(run.run_id, timeout=5)
    error = raised.value.error
    assert (error["code"], error["error_type"]) == ("workflow_error", "KeyError")
    assert "missing" in error["message"]


@workflow(name="engine.bad_result")
async def bad_result(ctx: WorkflowContext, params: None) -> Any:
    return {"a": object()}


async def test_a_workflow_result_that_is_not_json_fails_the_run(
    runner: InlineWorkflowRunner,
) -> None:
    run = await runner.client.submit("engine.bad_result")
    await runner.run(run.name, run.run_id)
    error = (await runner.client.get(run.run_id)).error
    assert error is not None
    assert error["code"] == "serialization"
    assert "engine.bad_result" in error["message"] and "object" in error["message"]


@step(name="nd.a")
def nd_a() -> str:
    SEEN.append("a")
    return "a"


@step(name="nd.b")
def nd_b() -> str:
    SEEN.append("b")
    return "b"


async def test_changed_step_order_fails_the_run_with_non_determinism(
    runner: InlineWorkflowRunner, caplog: pytest.LogCaptureFixture
) -> None:
    @workflow(name="engine.nd")
    async def original(ctx: WorkflowContext, params: None) -> list[str]:
        first = await nd_a()
        await ctx.sleep(60)
        return [first, await nd_b()]

    run = await runner.client.submit("engine.nd")
    await runner.run(run.name, run.run_id)
    assert SEEN == ["a"]

    @workflow(name="engine.nd")  # the same name again replaces the definition
    async def reordered(ctx: WorkflowContext, params: None) -> list[str]:
        first = await nd_b()
        await ctx.sleep(60)
        return [first, await nd_a()]

    await runner.client.wake(run.run_id)
    events = await runner.run(run.name, run.run_id)

    info = await runner.client.get(run.run_id)
    assert info.status is RunStatus.FAILED
    assert info.error is not None
    assert info.error["code"] == "non_determinism"
    assert info.error["error_type"] == "NonDeterminismError"
    assert "'nd.a'" in info.error["message"] and "'nd.b'" in info.error["message"]
    assert last(events, "run:error")["code"] == "non_determinism"
    assert SEEN == ["a"], "a diverging replay must not run the new step"
    gc.collect()  # the run's failure is reported once, not again as an unretrieved task error
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]


async def test_non_determinism_cannot_be_swallowed_by_the_workflow(
    runner: InlineWorkflowRunner,
) -> None:
    @workflow(name="engine.nd_swallow")
    async def original(ctx: WorkflowContext, params: None) -> str:
        await nd_a()
        await ctx.sleep(60)
        return "ok"

    run = await runner.client.submit("engine.nd_swallow")
    await runner.run(run.name, run.run_id)

    @workflow(name="engine.nd_swallow")
    async def swallowing(ctx: WorkflowContext, params: None) -> str:
        try:
            await nd_b()
        except Exception:
            pass
        await ctx.sleep(60)
        return "ok"

    await runner.client.wake(run.run_id)
    await runner.run(run.name, run.run_id)
    error = (await runner.client.get(run.run_id)).error
    assert error is not None and error["code"] == "non_determinism"


async def test_code_that_stops_before_the_journal_ends_is_non_deterministic(
    runner: InlineWorkflowRunner,
) -> None:
    @workflow(name="engine.nd_shorter")
    async def original(ctx: WorkflowContext, params: None) -> str:
        await nd_a()
        await nd_b()
        await ctx.sleep(60)
        return "ok"

    run = await runner.client.submit("engine.nd_shorter")
    await runner.run(run.name, run.run_id)

    @workflow(name="engine.nd_shorter")
    async def shorter(ctx: WorkflowContext, params: None) -> str:
        await nd_a()
        return "ok"

    await runner.client.wake(run.run_id)
    await runner.run(run.name, run.run_id)
    error = (await runner.client.get(run.run_id)).error
    assert error is not None and error["code"] == "non_determinism"
