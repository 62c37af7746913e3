"""Replay compatibility: which code changes a run in flight survives.

Each case records a real journal (the engine on the memory store, a manual clock) with
one version of a workflow, then asks ``replays_cleanly`` whether another version of its
code replays it: the same code does; a step renamed, reordered, removed or added before
the run's frontier does not; a change after the frontier does. No step code runs during a
check (``EXECUTED`` does not move).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from pyrula.workflows import InlineWorkflowRunner, MemoryStore, WorkflowContext, step, workflow
from pyrula.workflows.clock import ManualClock
from pyrula.workflows.compat import Stop, Verdict, check_replay, replays_cleanly
from pyrula.workflows.definition import WorkflowSpec

Event = dict[str, Any]
Body = Callable[[WorkflowContext, Any], Awaitable[Any]]
T0 = 1_800_000_000.0
EXECUTED: list[str] = []


def _run(name: str, value: Any) -> Any:
    EXECUTED.append(name)
    return value


@step(name="compat.a")
def a(x: int) -> int:
    return int(_run("compat.a", x + 1))


@step(name="compat.b")
async def b(x: int) -> int:
    return int(_run("compat.b", x * 2))


@step(name="compat.c")
def c(x: int) -> int:
    return int(_run("compat.c", x - 3))


@step(name="compat.d")
def d(x: int) -> int:
    return int(_run("compat.d", x))


@step(name="compat.b2")
async def b2(x: int) -> int:
    return int(_run("compat.b2", x))


@step(name="compat.flaky")
def flaky(x: int) -> int:
    raise ValueError("declined")


# --- the versions of the code ------------------------------------------------------------


async def sleeper(ctx: WorkflowContext, p: Any) -> Any:  # A, B, sleep, C
    x = await a(p["x"])
    y = await b(x)
    await ctx.sleep(60)
    return await c(y)


async def sleeper_renamed(ctx: WorkflowContext, p: Any) -> Any:
    x = await a(p["x"])
    y = await b2(x)
    await ctx.sleep(60)
    return await c(y)


async def sleeper_reordered(ctx: WorkflowContext, p: Any) -> Any:
    y = await b(p["x"])
    x = await a(y)
    await ctx.sleep(60)
    return await c(x)


async def sleeper_removed(ctx: WorkflowContext, p: Any) -> Any:
    x = await a(p["x"])
    await ctx.sleep(60)
    return await c(x)


async def sleeper_added(ctx: WorkflowContext, p: Any) -> Any:
    x = await a(p["x"])
    x = await d(x)
    y = await b(x)
    await ctx.sleep(60)
    return await c(y)


async def sleeper_value_added(ctx: WorkflowContext, p: Any) -> Any:
    x = await a(p["x"])
    ctx.now()
    y = await b(x)
    await ctx.sleep(60)
    return await c(y)


async def sleeper_after_frontier(ctx: WorkflowContext, p: Any) -> Any:
    x = await a(p["x"])
    y = await b(x)
    await ctx.sleep(120)  # a longer sleep: the recorded one still decides
    ctx.now()
    z = await d(y)  # C replaced, a step and a value added: all past the frontier
    return await c(z)


async def sleeper_branching(ctx: WorkflowContext, p: Any) -> Any:
    x = await a(p["x"])
    y = await b(x)
    if ctx.is_replaying:  # the code may look, as long as the calls stay the same
        pass
    await ctx.sleep(60)
    return await c(y)


async def waiter(ctx: WorkflowContext, p: Any) -> Any:  # A, wait, B
    x = await a(p["x"])
    got = await ctx.wait_for_signal("go", timeout=600)
    return await b(x + (got or 0))


async def waiter_step_first(ctx: WorkflowContext, p: Any) -> Any:
    x = await a(p["x"])
    x = await d(x)
    got = await ctx.wait_for_signal("go", timeout=600)
    return await b(x + (got or 0))


async def waiter_step_for_wait(ctx: WorkflowContext, p: Any) -> Any:
    x = await a(p["x"])
    got = await d(0)
    return await b(x + got)


async def asker(ctx: WorkflowContext, p: Any) -> Any:  # A, interrupt, C
    x = await a(p["x"])
    answer = await ctx.interrupt({"q": "ship?"})
    return await c(x if answer else 0)


async def gatherer(ctx: WorkflowContext, p: Any) -> Any:  # gather(A, B), sleep, C
    x, y = await asyncio.gather(a(p["x"]), b(p["x"]))
    await ctx.sleep(60)
    return await c(x + y)


async def gatherer_swapped(ctx: WorkflowContext, p: Any) -> Any:
    y, x = await asyncio.gather(b(p["x"]), a(p["x"]))
    await ctx.sleep(60)
    return await c(x + y)


async def gatherer_wide(ctx: WorkflowContext, p: Any) -> Any:
    # A third branch: it takes call 3, where the journal holds the sleep.
    x, y, _ = await asyncio.gather(a(p["x"]), b(p["x"]), d(p["x"]))
    await ctx.sleep(60)
    return await c(x + y)


async def counter(ctx: WorkflowContext, p: Any) -> Any:  # A, continue as new (or return)
    n = await a(p["n"])
    if n < p["until"]:
        ctx.continue_as_new({"n": n, "until": p["until"]})
    return n


async def counter_checked(ctx: WorkflowContext, p: Any) -> Any:
    n = await a(p["n"])
    n = await d(n)
    if n < p["until"]:
        ctx.continue_as_new({"n": n, "until": p["until"]})
    return n


async def two_steps(ctx: WorkflowContext, p: Any) -> Any:  # A, B, done
    return await b(await a(p["x"]))


async def one_step(ctx: WorkflowContext, p: Any) -> Any:
    return await a(p["x"])


async def failing(ctx: WorkflowContext, p: Any) -> Any:  # a step that failed for good
    return await flaky(p["x"])


async def stuck(ctx: WorkflowContext, p: Any) -> Any:
    await a(p["x"])
    await asyncio.Event().wait()  # something that is not the journal's: never set


# The recorded versions are registered; the others are only ever checked.
for _fn, _name in [(sleeper, "compat.sleeper"), (waiter, "compat.waiter"),
                   (asker, "compat.asker"), (gatherer, "compat.gatherer"),
                   (counter, "compat.counter"), (two_steps, "compat.two_steps"),
                   (failing, "compat.failing")]:
    workflow(name=_name)(_fn)


async def record(name: str, params: Any, *then: Callable[[InlineWorkflowRunner, str],
                                                          Awaitable[Any]]) -> list[Event]:
    """The journal of a new run of ``name`` at its first frontier, then after each of
    ``then`` (a signal, a resume...) and another attempt."""
    clock = ManualClock(start=T0)
    runner = InlineWorkflowRunner(store=MemoryStore(), clock=clock, workflows=[name],
                                  cloud=False)
    run = await runner.client.submit(name, params)
    events = await runner.run(name, run.run_id)
    for action in then:
        clock.advance(1)
        await action(runner, run.run_id)
        events = await runner.run(name, run.run_id)
    return events


def check(name: str, body: Body, journal: list[Event]) -> Verdict:
    before = list(EXECUTED)
    verdict = replays_cleanly(WorkflowSpec(name, body), journal, run_id="r-1")
    assert before == EXECUTED, "a check ran step code"
    return verdict


async def test_the_same_code_replays_a_run_parked_in_a_sleep() -> None:
    journal = await record("compat.sleeper", {"x": 1})
    assert journal[-1]["type"] == "run:sleeping"

    verdict = check("compat.sleeper", sleeper, journal)

    assert verdict == Verdict(True, Stop.FRONTIER, "call 3: pyrula.sleep", 3)
    assert verdict


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (sleeper_renamed, "has 'compat.b' at call 2, but the code now calls 'compat.b2'"),
        (sleeper_reordered, "has 'compat.a' at call 1, but the code now calls 'compat.b'"),
        (sleeper_removed, "has 'compat.b' at call 2, but the code now calls 'pyrula.sleep'"),
        (sleeper_added, "has 'compat.b' at call 2, but the code now calls 'compat.d'"),
        (sleeper_value_added, "has 'compat.b' at call 2, but the code now calls 'pyrula.now'"),
    ],
    ids=["renamed", "reordered", "removed", "added", "value-added"],
)
async def test_a_change_before_the_frontier_does_not_replay(body: Body, reason: str) -> None:
    journal = await record("compat.sleeper", {"x": 1})

    verdict = check("compat.sleeper", body, journal)

    assert not verdict
    assert verdict.stop is Stop.DIVERGED
    assert verdict.reason is not None and reason in verdict.reason
    assert "workflow 'compat.sleeper' run r-1" in verdict.reason


@pytest.mark.parametrize("body", [sleeper_after_frontier, sleeper_branching],
                         ids=["after-frontier", "looks-at-is_replaying"])
async def test_a_change_after_the_frontier_replays(body: Body) -> None:
    journal = await record("compat.sleeper", {"x": 1})

    assert check("compat.sleeper", body, journal) == Verdict(
        True, Stop.FRONTIER, "call 3: pyrula.sleep", 3)


async def test_a_sleep_whose_timer_fired_replays_up_to_the_next_step() -> None:
    journal = await record("compat.sleeper", {"x": 1})
    clock_fired = {"type": "run:woken", "ts": T0 + 61, "reason": "timer",
                   "seq": journal[-1]["seq"] + 1}

    verdict = check("compat.sleeper", sleeper_after_frontier, [*journal, clock_fired])

    # Past the sleep the journal holds nothing: the value added there is the frontier.
    assert verdict == Verdict(True, Stop.FRONTIER, "call 4: pyrula.now", 4)


async def test_a_run_parked_in_a_wait() -> None:
    journal = await record("compat.waiter", {"x": 1})
    assert journal[-1]["type"] == "run:waiting"

    assert check("compat.waiter", waiter, journal) == Verdict(
        True, Stop.FRONTIER, "call 2: pyrula.wait_for_signal", 2)
    diverged = check("compat.waiter", waiter_step_first, journal)
    assert diverged.stop is Stop.DIVERGED and "'compat.d'" in str(diverged.reason)


async def test_a_signalled_wait_replays_with_its_payload_up_to_the_next_step() -> None:
    async def signal(runner: InlineWorkflowRunner, run_id: str) -> None:
        await runner.client.signal(run_id, "go", 5)

    journal = await record("compat.waiter", {"x": 1}, signal)
    assert journal[-1]["type"] == "run:completed"

    assert check("compat.waiter", waiter, journal) == Verdict(True, Stop.RETURNED, None, 3)
    swapped = check("compat.waiter", waiter_step_for_wait, journal)
    assert swapped.stop is Stop.DIVERGED
    assert "has 'pyrula.wait_for_signal' at call 2, but the code now calls 'compat.d'" in str(
        swapped.reason)


async def test_a_run_parked_on_an_interrupt_and_resumed() -> None:
    journal = await record("compat.asker", {"x": 1})
    assert check("compat.asker", asker, journal) == Verdict(
        True, Stop.FRONTIER, "call 2: pyrula.interrupt", 2)

    async def resume(runner: InlineWorkflowRunner, run_id: str) -> None:
        await runner.client.resume(run_id, True)

    ended = await record("compat.asker", {"x": 1}, resume)
    assert check("compat.asker", asker, ended) == Verdict(True, Stop.RETURNED, None, 3)


async def test_branches_run_together_are_checked_in_call_order() -> None:
    journal = await record("compat.gatherer", {"x": 1})

    assert check("compat.gatherer", gatherer, journal).stop is Stop.FRONTIER
    swapped = check("compat.gatherer", gatherer_swapped, journal)
    assert swapped.stop is Stop.DIVERGED
    assert "has 'compat.a' at call 1, but the code now calls 'compat.b'" in str(swapped.reason)
    wide = check("compat.gatherer", gatherer_wide, journal)
    assert wide.stop is Stop.DIVERGED and "'pyrula.sleep' at call 3" in str(wide.reason)


async def test_a_continued_run_and_its_successor() -> None:
    clock = ManualClock(start=T0)
    runner = InlineWorkflowRunner(store=MemoryStore(), clock=clock,
                                  workflows=["compat.counter"], cloud=False)
    first = await runner.client.submit("compat.counter", {"n": 0, "until": 2})
    continued = await runner.run("compat.counter", first.run_id)
    assert continued[-1]["type"] == "run:continued"
    successor = str(continued[-1]["successor"])
    queued = await runner.store.read_events(successor)  # a successor nobody claimed yet

    assert check("compat.counter", counter, continued) == Verdict(True, Stop.CONTINUED, None, 1)
    assert check("compat.counter", counter_checked, continued) == Verdict(
        True, Stop.FRONTIER, "call 2: step 'compat.d'", 2)
    assert check("compat.counter", counter, queued) == Verdict(
        True, Stop.FRONTIER, "call 1: step 'compat.a'", 1)
    done = await runner.run("compat.counter", successor)
    assert done[-1]["type"] == "run:completed"
    assert check("compat.counter", counter, done) == Verdict(True, Stop.RETURNED, None, 1)


async def test_code_that_returns_before_the_journal_ends_does_not_replay() -> None:
    journal = await record("compat.two_steps", {"x": 1})
    assert journal[-1]["type"] == "run:completed"

    verdict = check("compat.two_steps", one_step, journal)

    assert verdict.stop is Stop.DIVERGED
    assert "the code returned after 1 calls, but the journal records call 2" in str(
        verdict.reason)


async def test_a_recorded_failure_is_raised_again_not_a_divergence() -> None:
    journal = await record("compat.failing", {"x": 1})
    assert journal[-1]["type"] == "run:error"

    verdict = check("compat.failing", failing, journal)

    assert verdict.ok and verdict.stop is Stop.RAISED
    assert "StepFailed" in str(verdict.reason) and "declined" in str(verdict.reason)


async def test_code_awaiting_something_else_is_not_taken_as_replaying() -> None:
    journal = await record("compat.sleeper", {"x": 1})

    verdict = replays_cleanly(WorkflowSpec("compat.sleeper", stuck), journal, timeout=0.05)

    assert verdict.stop is Stop.STUCK and not verdict.ok
    assert "after call 1" in str(verdict.reason)


async def test_a_journal_of_another_workflow_does_not_replay() -> None:
    journal = await record("compat.sleeper", {"x": 1})

    verdict = check("compat.waiter", waiter, journal)

    assert verdict.stop is Stop.DIVERGED
    assert verdict.reason == "run r-1 is a run of 'compat.sleeper', not of 'compat.waiter'"


async def test_a_journal_without_its_start_is_refused() -> None:
    journal = await record("compat.sleeper", {"x": 1})

    with pytest.raises(ValueError, match="starts with its run:submitted"):
        replays_cleanly(WorkflowSpec("compat.sleeper", sleeper), journal[2:])


async def test_the_coroutine_runs_on_the_callers_loop() -> None:
    journal = await record("compat.sleeper", {"x": 1})

    verdict = await check_replay(WorkflowSpec("compat.sleeper", sleeper_renamed), journal)

    assert verdict.stop is Stop.DIVERGED


def test_replays_cleanly_works_without_a_running_loop() -> None:
    journal = asyncio.run(record("compat.sleeper", {"x": 1}))

    assert check("compat.sleeper", sleeper, journal).stop is Stop.FRONTIER
