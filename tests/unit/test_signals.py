"""Durable timers, signals and interrupts: parking, waking, buffering, timeouts, replay."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from pyrula.workflows import (
    InlineWorkflowRunner,
    MemoryStore,
    RunStatus,
    WorkflowContext,
    step,
    workflow,
)
from pyrula.workflows.clock import ManualClock
from pyrula.workflows.engine import AttemptSettings
from tests.unit.journal import last, of_type, types


async def fire_timers(runner: InlineWorkflowRunner, clock: ManualClock, seconds: float) -> int:
    """Move time on and let the store wake what is due, as a worker's timer loop would."""
    clock.advance(seconds)
    return await runner.store.wake_due(now=clock.now(), limit=100)


@workflow(name="signals.sleeps")
async def sleeps(ctx: WorkflowContext, params: dict[str, Any]) -> str:
    await ctx.sleep(params["seconds"])
    await ctx.sleep(timedelta(minutes=params["minutes"]))
    await ctx.sleep_until(datetime.fromtimestamp(params["until"], UTC))
    return "rested"


async def test_sleep_sleep_until_and_timedelta_park_until_their_time(
    timed_runner: InlineWorkflowRunner, clock: ManualClock
) -> None:
    runner = timed_runner
    start = clock.now()
    params = {"seconds": 10, "minutes": 2, "until": start + 1000}
    run = await runner.client.submit("signals.sleeps", params)

    events = await runner.run(run.name, run.run_id)
    info = await runner.client.get(run.run_id)
    assert info.status is RunStatus.SLEEPING
    assert info.wake_at == start + 10
    assert last(events, "run:sleeping")["wake_at"] == start + 10

    assert await fire_timers(runner, clock, 9) == 0  # not due yet
    assert await fire_timers(runner, clock, 1) == 1
    events = await runner.run(run.name, run.run_id)
    assert (await runner.client.get(run.run_id)).wake_at == clock.now() + 120
    assert last(events, "run:sleeping")["wake_at"] == clock.now() + 120

    assert await fire_timers(runner, clock, 120) == 1
    events = await runner.run(run.name, run.run_id)
    assert (await runner.client.get(run.run_id)).wake_at == start + 1000

    assert await fire_timers(runner, clock, start + 1000 - clock.now()) == 1
    events = await runner.run(run.name, run.run_id)
    assert await runner.client.result(run.run_id, timeout=5) == "rested"
    assert len(of_type(events, "run:sleeping")) == 3
    assert [e["reason"] for e in of_type(events, "run:woken")] == ["timer"] * 3


@workflow(name="signals.naive_until")
async def naive_until(ctx: WorkflowContext, params: float) -> str:
    await ctx.sleep_until(datetime.fromtimestamp(params, UTC).replace(tzinfo=None))
    return "ok"


async def test_sleep_until_reads_a_naive_datetime_as_utc(
    timed_runner: InlineWorkflowRunner, clock: ManualClock
) -> None:
    runner = timed_runner
    run = await runner.client.submit("signals.naive_until", clock.now() + 500)
    await runner.run(run.name, run.run_id)
    assert (await runner.client.get(run.run_id)).wake_at == clock.now() + 500


@workflow(name="signals.no_wait_sleeps")
async def no_wait_sleeps(ctx: WorkflowContext, params: float) -> str:
    await ctx.sleep(0)
    await ctx.sleep_until(datetime.fromtimestamp(params, UTC))
    return "never parked"


async def test_sleeps_already_due_do_not_park(
    timed_runner: InlineWorkflowRunner, clock: ManualClock
) -> None:
    runner = timed_runner
    run = await runner.client.submit("signals.no_wait_sleeps", clock.now() - 60)
    events = await runner.run(run.name, run.run_id)
    assert await runner.client.result(run.run_id, timeout=5) == "never parked"
    assert not of_type(events, "run:sleeping")


@workflow(name="signals.approval")
async def approval(ctx: WorkflowContext, params: None) -> Any:
    return {"approved": await ctx.wait_for_signal("approved")}


async def test_signal_sent_before_the_wait_is_buffered_and_consumed(
    store_runner: InlineWorkflowRunner,
) -> None:
    runner = store_runner
    run = await runner.client.submit("signals.approval")
    await runner.client.signal(run.run_id, "approved", {"by": "alice"})
    assert (await runner.client.get(run.run_id)).status is RunStatus.QUEUED

    events = await runner.run(run.name, run.run_id)

    assert await runner.client.result(run.run_id, timeout=5) == {"approved": {"by": "alice"}}
    assert not of_type(events, "run:waiting")
    assert last(events, "signal:received")["payload"] == {"by": "alice"}


async def test_signal_after_park_requeues_the_run(store_runner: InlineWorkflowRunner) -> None:
    runner = store_runner
    run = await runner.client.submit("signals.approval")
    events = await runner.run(run.name, run.run_id)
    info = await runner.client.get(run.run_id)
    assert info.status is RunStatus.WAITING
    assert info.waiting_for == ("approved",)
    assert last(events, "run:waiting")["signal"] == "approved"

    await runner.client.signal(run.run_id, "unrelated", 1)
    assert (await runner.client.get(run.run_id)).status is RunStatus.WAITING
    await runner.client.signal(run.run_id, "approved", True)
    assert (await runner.client.get(run.run_id)).status is RunStatus.QUEUED

    await runner.run(run.name, run.run_id)
    assert await runner.client.result(run.run_id, timeout=5) == {"approved": True}


@workflow(name="signals.two_in_order")
async def two_in_order(ctx: WorkflowContext, params: None) -> list[Any]:
    return [await ctx.wait_for_signal("item"), await ctx.wait_for_signal("item")]


async def test_buffered_signals_are_consumed_once_each_in_order(
    runner: InlineWorkflowRunner,
) -> None:
    run = await runner.client.submit("signals.two_in_order")
    await runner.client.signal(run.run_id, "item", "first")
    await runner.client.signal(run.run_id, "item", "second")
    await runner.run(run.name, run.run_id)
    assert await runner.client.result(run.run_id, timeout=5) == ["first", "second"]


@workflow(name="signals.with_timeout")
async def with_timeout(ctx: WorkflowContext, params: None) -> dict[str, Any]:
    answer = await ctx.wait_for_signal("answer", timeout=timedelta(seconds=60))
    await ctx.sleep(3600)
    return {"answer": answer}


async def test_wait_timeout_returns_none(
    timed_runner: InlineWorkflowRunner, clock: ManualClock
) -> None:
    runner = timed_runner
    run = await runner.client.submit("signals.with_timeout")
    events = await runner.run(run.name, run.run_id)
    info = await runner.client.get(run.run_id)
    assert info.status is RunStatus.WAITING
    assert info.wake_at == clock.now() + 60
    assert last(events, "run:waiting")["timeout_at"] == clock.now() + 60

    assert await fire_timers(runner, clock, 61) == 1
    await runner.run(run.name, run.run_id)
    assert (await runner.client.get(run.run_id)).status is RunStatus.SLEEPING

    assert await fire_timers(runner, clock, 3600) == 1
    await runner.run(run.name, run.run_id)
    assert await runner.client.result(run.run_id, timeout=5) == {"answer": None}


async def test_a_timed_out_wait_stays_timed_out_on_replay(
    timed_runner: InlineWorkflowRunner, clock: ManualClock
) -> None:
    runner = timed_runner
    run = await runner.client.submit("signals.with_timeout")
    await runner.run(run.name, run.run_id)
    assert await fire_timers(runner, clock, 61) == 1
    await runner.run(run.name, run.run_id)  # the wait times out; the run sleeps

    await runner.client.signal(run.run_id, "answer", "too late")  # buffered, not awaited
    assert (await runner.client.get(run.run_id)).status is RunStatus.SLEEPING
    await runner.client.wake(run.run_id)
    events = await runner.run(run.name, run.run_id)

    assert await runner.client.result(run.run_id, timeout=5) == {"answer": None}
    assert types(events).index("signal:received") > types(events).index("run:woken")


async def test_a_signal_before_the_timeout_wins(
    timed_runner: InlineWorkflowRunner, clock: ManualClock
) -> None:
    runner = timed_runner
    run = await runner.client.submit("signals.with_timeout")
    await runner.run(run.name, run.run_id)
    clock.advance(30)
    await runner.client.signal(run.run_id, "answer", 42)
    await runner.run(run.name, run.run_id)
    assert await fire_timers(runner, clock, 31) == 0, "the answered wait's timer must not fire"

    await runner.client.wake(run.run_id)
    await runner.run(run.name, run.run_id)
    assert await runner.client.result(run.run_id, timeout=5) == {"answer": 42}


CLIENTS: dict[str, Any] = {}


@step(name="signals.send_to_myself")
async def send_to_myself(run_id: str) -> str:
    await CLIENTS[run_id].signal(run_id, "ready", "from a step")
    return "sent"


@workflow(name="signals.self_signal")
async def self_signal(ctx: WorkflowContext, params: None) -> Any:
    await send_to_myself(ctx.run_id)
    return await ctx.wait_for_signal("ready")


async def test_a_signal_that_arrives_while_the_run_parks_is_not_lost() -> None:
    """Without a flush at the step boundary the engine learns of the signal only when
    the store refuses to park the run for it; the wait must then take it."""
    runner = InlineWorkflowRunner(
        store=MemoryStore(), settings=AttemptSettings(step_boundary_durability=False),
        cloud=False,
    )
    run = await runner.client.submit("signals.self_signal")
    CLIENTS[run.run_id] = runner.client
    try:
        events = await runner.run(run.name, run.run_id)
    finally:
        CLIENTS.pop(run.run_id)
        await runner.aclose()

    assert await runner.client.result(run.run_id, timeout=5) == "from a step"
    assert types(events).index("signal:received") < types(events).index("run:waiting")


@workflow(name="signals.poll")
async def poll(ctx: WorkflowContext, params: None) -> list[Any]:
    first = await ctx.wait_for_signal("news", timeout=0)
    await ctx.sleep(60)
    second = await ctx.wait_for_signal("news", timeout=0)
    return [first, second]


async def test_a_zero_timeout_wait_polls_and_replays_the_same(
    runner: InlineWorkflowRunner,
) -> None:
    run = await runner.client.submit("signals.poll")
    await runner.run(run.name, run.run_id)
    assert (await runner.client.get(run.run_id)).status is RunStatus.SLEEPING

    await runner.client.signal(run.run_id, "news", "arrived during the sleep")
    await runner.client.wake(run.run_id)
    await runner.run(run.name, run.run_id)

    # The first poll found nothing when it ran; on replay it must not take the signal
    # that came later, which belongs to the second poll.
    assert await runner.client.result(run.run_id, timeout=5) == [
        None, "arrived during the sleep"
    ]


@workflow(name="signals.interrupt")
async def ask(ctx: WorkflowContext, params: dict[str, Any]) -> dict[str, Any]:
    answer = await ctx.interrupt({"question": params["question"]})
    return {"answer": answer}


async def test_interrupt_parks_until_resumed(store_runner: InlineWorkflowRunner) -> None:
    runner = store_runner
    run = await runner.client.submit("signals.interrupt", {"question": "ship it?"})
    events = await runner.run(run.name, run.run_id)

    info = await runner.client.get(run.run_id)
    assert info.status is RunStatus.WAITING
    assert info.interrupt == {"question": "ship it?"}
    assert last(events, "run:waiting")["interrupt"] == {"question": "ship it?"}

    await runner.client.resume(run.run_id, {"yes": True})
    assert (await runner.client.get(run.run_id)).status is RunStatus.QUEUED
    events = await runner.run(run.name, run.run_id)

    assert await runner.client.result(run.run_id, timeout=5) == {"answer": {"yes": True}}
    assert last(events, "interrupt:resumed")["payload"] == {"yes": True}
    assert (await runner.client.get(run.run_id)).interrupt is None
