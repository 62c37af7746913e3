"""Step retries: attempts, the journal, StepFailed, backoff spacing, parking on long delays."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from pyrula.workflows import (
    InlineWorkflowRunner,
    MemoryStore,
    RunFailed,
    RunStatus,
    StepFailed,
    WorkflowContext,
    step,
    workflow,
)
from pyrula.workflows.clock import ManualClock
from pyrula.workflows.engine import AttemptSettings
from tests.conftest import await_until
from tests.unit.journal import last, of_type, types

ATTEMPTS: list[int] = []
#: How many more calls of ``flaky`` fail before it succeeds.
FAILURES = {"left": 0}


@pytest.fixture(autouse=True)
def _reset() -> None:
    ATTEMPTS.clear()
    FAILURES["left"] = 0


def _flaky(x: int) -> int:
    ATTEMPTS.append(x)
    if FAILURES["left"] > 0:
        FAILURES["left"] -= 1
        raise ConnectionError(f"flaky failure #{len(ATTEMPTS)}")
    return x * 10


flaky_fast = step(name="retries.flaky_fast", retries=2, retry_backoff=0.001)(_flaky)
flaky_no_retry = step(name="retries.flaky_no_retry")(_flaky)
flaky_slow = step(
    name="retries.flaky_slow", retries=4, retry_backoff=10.0, retry_backoff_max=25.0
)(_flaky)
flaky_inline = step(name="retries.flaky_inline", retries=3, retry_backoff=0.5)(_flaky)
flaky_long = step(name="retries.flaky_long", retries=1, retry_backoff=30.0)(_flaky)

STEPS = {
    s.__pyrula_step__.name: s
    for s in (flaky_fast, flaky_no_retry, flaky_slow, flaky_long, flaky_inline)
}


@workflow(name="retries.uncaught")
async def uncaught(ctx: WorkflowContext, params: dict[str, Any]) -> int:
    return int(await STEPS[params["step"]](7))


@workflow(name="retries.caught")
async def caught(ctx: WorkflowContext, params: dict[str, Any]) -> dict[str, Any]:
    try:
        value = await STEPS[params["step"]](7)
    except StepFailed as exc:
        return {"failed": exc.step, "error_type": exc.error_type, "attempts": exc.attempts}
    return {"value": value}


async def test_retries_n_gives_n_plus_one_attempts(runner: InlineWorkflowRunner) -> None:
    FAILURES["left"] = 100
    run = await runner.client.submit("retries.uncaught", {"step": "retries.flaky_fast"})
    events = await runner.run(run.name, run.run_id)

    assert len(ATTEMPTS) == 3  # retries=2: the first attempt and two more
    assert [e["attempt"] for e in of_type(events, "step:started")] == [1, 2, 3]
    failed = of_type(events, "step:failed")
    assert [e["will_retry"] for e in failed] == [True, True, False]
    assert [e["attempt"] for e in failed] == [1, 2, 3]
    assert all(e["error_type"] == "ConnectionError" for e in failed)
    assert "retry_at" in failed[0] and "retry_at" not in failed[-1]

    info = await runner.client.get(run.run_id)
    assert info.status is RunStatus.FAILED
    assert info.error is not None
    assert info.error["code"] == "step_failed"
    assert info.error["error_type"] == "ConnectionError"
    assert "retries.flaky_fast" in info.error["message"]
    assert last(events, "run:error")["code"] == "step_failed"
    with pytest.raises(RunFailed) as raised:
        await runner.client.result(run.run_id, timeout=5)
    assert raised.value.error["code"] == "step_failed"


async def test_a_retry_that_succeeds_completes_the_run(runner: InlineWorkflowRunner) -> None:
    FAILURES["left"] = 2
    run = await runner.client.submit("retries.uncaught", {"step": "retries.flaky_fast"})
    events = await runner.run(run.name, run.run_id)

    assert await runner.client.result(run.run_id, timeout=5) == 70
    assert [e["will_retry"] for e in of_type(events, "step:failed")] == [True, True]
    assert len(of_type(events, "step:completed")) == 1


async def test_no_retries_by_default(runner: InlineWorkflowRunner) -> None:
    FAILURES["left"] = 1
    run = await runner.client.submit("retries.uncaught", {"step": "retries.flaky_no_retry"})
    events = await runner.run(run.name, run.run_id)

    assert len(ATTEMPTS) == 1
    assert [e["will_retry"] for e in of_type(events, "step:failed")] == [False]
    assert (await runner.client.get(run.run_id)).status is RunStatus.FAILED


async def test_step_failed_is_catchable_in_the_workflow(runner: InlineWorkflowRunner) -> None:
    FAILURES["left"] = 100
    run = await runner.client.submit("retries.caught", {"step": "retries.flaky_fast"})
    await runner.run(run.name, run.run_id)

    assert await runner.client.result(run.run_id, timeout=5) == {
        "failed": "retries.flaky_fast",
        "error_type": "ConnectionError",
        "attempts": 3,
    }


SLOW_CALLS: list[int] = []


@step(name="retries.slow_then_fast", timeout=0.02, retries=2, retry_backoff=0)
async def slow_then_fast() -> int:
    SLOW_CALLS.append(len(SLOW_CALLS) + 1)
    if len(SLOW_CALLS) < 3:
        await asyncio.sleep(30)
    return len(SLOW_CALLS)


@workflow(name="retries.timeouts")
async def timeouts(ctx: WorkflowContext, params: None) -> int:
    return int(await slow_then_fast())


async def test_a_timed_out_attempt_is_retried(runner: InlineWorkflowRunner) -> None:
    SLOW_CALLS.clear()
    run = await runner.client.submit("retries.timeouts")
    events = await runner.run(run.name, run.run_id)

    assert await runner.client.result(run.run_id, timeout=5) == 3
    failed = of_type(events, "step:failed")
    assert [e["will_retry"] for e in failed] == [True, True]
    assert all("Timeout" in e["error_type"] for e in failed)


@workflow(name="retries.beside_a_sleep")
async def beside_a_sleep(ctx: WorkflowContext, params: None) -> int:
    _, value = await asyncio.gather(ctx.sleep(3600), flaky_fast(7))
    return int(value)


async def test_a_short_retry_is_not_held_back_by_a_parallel_sleep(
    runner: InlineWorkflowRunner,
) -> None:
    FAILURES["left"] = 1
    run = await runner.client.submit("retries.beside_a_sleep")
    events = await runner.run(run.name, run.run_id)

    assert len(ATTEMPTS) == 2, "the retry is due in milliseconds, not when the sleep ends"
    assert of_type(events, "step:completed")[-1]["result"] == 70
    assert (await runner.client.get(run.run_id)).status is RunStatus.SLEEPING


async def test_short_backoffs_are_waited_inline_and_double(
    timed_runner: InlineWorkflowRunner, clock: ManualClock
) -> None:
    """Delays of 0.5, 1 and 2 s (plus jitter) stay under the inline limit: the attempt
    waits them out on its clock, which this test moves by hand while the run goes on."""
    runner = timed_runner
    FAILURES["left"] = 3
    run = await runner.client.submit("retries.uncaught", {"step": "retries.flaky_inline"})
    task = asyncio.ensure_future(runner.run(run.name, run.run_id))

    async def moved_on() -> bool:
        clock.advance(0.25)
        return task.done()

    await await_until(moved_on, interval=0.001, what="the inline retries")
    events = task.result()

    assert await runner.client.result(run.run_id, timeout=5) == 70
    failed = of_type(events, "step:failed")
    starts = of_type(events, "step:started")
    assert [e["will_retry"] for e in failed] == [True, True, True]
    for k, (fail, retry) in enumerate(zip(failed, starts[1:], strict=True), start=1):
        nominal = 0.5 * 2 ** (k - 1)
        assert nominal <= fail["retry_at"] - fail["ts"] <= nominal * 1.1 + 1e-6
        assert retry["ts"] >= fail["retry_at"] - 1e-6, "a retry started before its backoff"
    assert not of_type(events, "run:sleeping"), "short delays do not park the run"


async def test_backoff_doubles_from_retry_backoff_and_is_capped() -> None:
    """Delays before retries 1..4 are 10, 20, 40->25 (cap), 80->25 (cap), plus jitter.

    Every delay exceeds the inline limit (set to 0 here), so each retry parks the run on
    a durable timer; a manual clock moves time, so the journal values are exact.
    """
    clock = ManualClock()
    runner = InlineWorkflowRunner(
        store=MemoryStore(), clock=clock, settings=AttemptSettings(inline_retry_max=0.0),
        cloud=False,
    )
    FAILURES["left"] = 100
    run = await runner.client.submit("retries.uncaught", {"step": "retries.flaky_slow"})
    events = await runner.run(run.name, run.run_id)
    for _ in range(4):
        assert (await runner.client.get(run.run_id)).status is RunStatus.SLEEPING
        clock.advance(30)
        assert await runner.store.wake_due(now=clock.now(), limit=100) == 1
        events = await runner.run(run.name, run.run_id)

    assert len(ATTEMPTS) == 5
    failed = of_type(events, "step:failed")
    assert [e["will_retry"] for e in failed] == [True, True, True, True, False]
    delays = [e["retry_at"] - e["ts"] for e in failed[:-1]]
    for delay, nominal in zip(delays, [10.0, 20.0, 25.0, 25.0], strict=True):
        assert nominal <= delay <= nominal * 1.1 + 1e-6, delays
    sleeps = [e for e in of_type(events, "run:sleeping") if e.get("reason") == "retry"]
    assert [e["wake_at"] for e in sleeps] == [e["retry_at"] for e in failed[:-1]]
    assert all(e["step"] == "retries.flaky_slow" for e in sleeps)
    assert (await runner.client.get(run.run_id)).status is RunStatus.FAILED
    await runner.aclose()


async def test_a_long_backoff_parks_the_run_instead_of_holding_its_slot(
    timed_runner: InlineWorkflowRunner, clock: ManualClock
) -> None:
    runner = timed_runner
    FAILURES["left"] = 1
    run = await runner.client.submit("retries.uncaught", {"step": "retries.flaky_long"})
    events = await runner.run(run.name, run.run_id)

    info = await runner.client.get(run.run_id)
    assert info.status is RunStatus.SLEEPING
    failed = last(events, "step:failed")
    assert failed["will_retry"] is True
    assert info.wake_at == failed["retry_at"]
    assert 30.0 <= failed["retry_at"] - clock.now() <= 33.0 + 1e-6
    assert types(events)[-1] == "run:sleeping"
    assert events[-1]["reason"] == "retry"
    assert events[-1]["ts"] == clock.now()

    # Early, nothing is due; at the retry time the timer requeues the run.
    assert await runner.store.wake_due(now=clock.now(), limit=100) == 0
    clock.advance(34)
    assert await runner.store.wake_due(now=clock.now(), limit=100) == 1
    events = await runner.run(run.name, run.run_id)

    assert await runner.client.result(run.run_id, timeout=5) == 70
    assert len(ATTEMPTS) == 2
    assert [e["attempt"] for e in of_type(events, "step:started")] == [1, 2]



async def test_a_retried_try_is_a_warning_naming_the_try_the_delay_and_the_error(
    runner: InlineWorkflowRunner, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("WARNING", logger="pyrula")
    FAILURES["left"] = 2
    run = await runner.client.submit("retries.uncaught", {"step": "retries.flaky_fast"})
    await runner.run(run.name, run.run_id)
    retries = [r for r in caplog.records if getattr(r, "event", None) == "step_retry"]
    assert [r.levelname for r in retries] == ["WARNING", "WARNING"]
    first = retries[0].getMessage()
    assert first.startswith(f"step_retry: step retries.flaky_fast of run {run.run_id} "
                            "try 2 of 3 in 0.0 s: ConnectionError: flaky failure #1"), first
    assert "test_retries.py:" in first and "in _flaky" in first  # the failing frame
    assert "try 3 of 3" in retries[1].getMessage()


async def test_a_failed_step_keeps_its_own_traceback_in_the_run_error(
    runner: InlineWorkflowRunner,
) -> None:
    FAILURES["left"] = 100
    run = await runner.client.submit("retries.uncaught", {"step": "retries.flaky_no_retry"})
    events = await runner.run(run.name, run.run_id)
    trace = last(events, "step:failed")["traceback"]
    assert 'raise ConnectionError(f"flaky failure #{len(ATTEMPTS)}")' in trace
    assert "pyrula/workflows" not in trace  # the step's frames, not the engine's
    info = await runner.client.get(run.run_id)
    assert info.error is not None and info.error["detail"]["traceback"] == trace


async def test_a_run_woken_early_from_a_retry_backoff_parks_again_on_the_same_retry(
    timed_runner: InlineWorkflowRunner, clock: ManualClock
) -> None:
    """The journal's run:sleeping for the retry is replayed, not written a second time."""
    runner = timed_runner
    FAILURES["left"] = 1
    run = await runner.client.submit("retries.uncaught", {"step": "retries.flaky_long"})
    await runner.run(run.name, run.run_id)
    retry_at = (await runner.client.get(run.run_id)).wake_at

    clock.advance(5)
    assert await runner.client.wake(run.run_id) is True
    await runner.run(run.name, run.run_id)

    info = await runner.client.get(run.run_id)
    assert info.status is RunStatus.SLEEPING and info.wake_at == retry_at
    events = await runner.client.events(run.run_id)
    assert len(ATTEMPTS) == 1, "the step is not tried again before its retry is due"
    sleeps = of_type(events, "run:sleeping")
    assert [(e["reason"], e["call"], e["wake_at"]) for e in sleeps] == [
        ("retry", 1, retry_at)]


@workflow(name="retries.caught_then_sleeps")
async def caught_then_sleeps(ctx: WorkflowContext, params: None) -> dict[str, Any]:
    try:
        await flaky_no_retry(7)
    except StepFailed as exc:
        failure = {"step": exc.step, "error_type": exc.error_type, "message": exc.message}
    await ctx.sleep(60)
    return failure


async def test_a_failed_step_replays_the_failure_it_journaled(
    timed_runner: InlineWorkflowRunner, clock: ManualClock
) -> None:
    """After a park, the step is not run again: its StepFailed comes back from the
    journal with the step, the error type and the message of the first attempt."""
    runner = timed_runner
    FAILURES["left"] = 1
    run = await runner.client.submit("retries.caught_then_sleeps")
    await runner.run(run.name, run.run_id)
    clock.advance(61)
    assert await runner.store.wake_due(now=clock.now(), limit=100) == 1
    await runner.run(run.name, run.run_id)

    assert await runner.client.result(run.run_id, timeout=5) == {
        "step": "retries.flaky_no_retry", "error_type": "ConnectionError",
        "message": "flaky failure #1"}
    assert len(ATTEMPTS) == 1
    failed = of_type(await runner.client.events(run.run_id), "step:failed")
    assert [(e["step"], e["message"]) for e in failed] == [
        ("retries.flaky_no_retry", "flaky failure #1")]
