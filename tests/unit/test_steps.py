"""Steps: sync and async, naming, journaling, never re-run once recorded, timeouts, results."""

from __future__ import annotations

import asyncio
import threading
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
from pyrula.workflows.engine import AttemptSettings
from tests.unit.journal import last, of_type, step_names, types

CALLS: list[str] = []


@pytest.fixture(autouse=True)
def _reset_calls() -> None:
    CALLS.clear()


@step
def add_one(x: int) -> int:
    CALLS.append("add_one")
    return x + 1


@step
async def double(x: int) -> int:
    CALLS.append("double")
    await asyncio.sleep(0)
    return x * 2


@step(name="steps.renamed")
def renamed(x: int) -> int:
    CALLS.append("renamed")
    return -x


@workflow(name="steps.sync_and_async")
async def sync_and_async(ctx: WorkflowContext, params: dict[str, Any]) -> dict[str, int]:
    a = await add_one(params["x"])
    b = await double(a)
    c = await renamed(b)
    return {"a": a, "b": b, "c": c}


async def test_sync_and_async_steps_run_and_are_journaled(runner: InlineWorkflowRunner) -> None:
    run = await runner.client.submit("steps.sync_and_async", {"x": 3})
    events = await runner.run(run.name, run.run_id)

    assert await runner.client.result(run.run_id, timeout=5) == {"a": 4, "b": 8, "c": -8}
    assert CALLS == ["add_one", "double", "renamed"]
    assert types(events) == [
        "run:submitted", "run:started",
        "step:started", "step:completed",
        "step:started", "step:completed",
        "step:started", "step:completed",
        "run:completed",
    ]
    completed = of_type(events, "step:completed")
    assert [e["result"] for e in completed] == [4, 8, -8]
    assert [e["call"] for e in completed] == [1, 2, 3]
    assert last(events, "run:completed")["result"] == {"a": 4, "b": 8, "c": -8}
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))


def test_step_outside_a_workflow_is_the_plain_function() -> None:
    assert add_one(1) == 2
    assert asyncio.run(double(5)) == 10
    assert renamed(4) == -4
    assert CALLS == ["add_one", "double", "renamed"]
    assert add_one.__name__ == "add_one"


async def test_step_name_defaults_to_qualname_and_can_be_given(
    runner: InlineWorkflowRunner,
) -> None:
    @step
    def nested(x: int) -> int:
        return x

    @workflow(name="steps.names")
    async def names(ctx: WorkflowContext, params: None) -> int:
        await add_one(1)
        await renamed(1)
        return int(await nested(7))

    run = await runner.client.submit("steps.names")
    events = await runner.run(run.name, run.run_id)

    assert nested.__qualname__.endswith("<locals>.nested")
    assert step_names(events) == ["add_one", "steps.renamed", nested.__qualname__]
    assert [e["step"] for e in of_type(events, "step:started")] == step_names(events)


@workflow(name="steps.then_sleep")
async def step_then_sleep(ctx: WorkflowContext, params: dict[str, Any]) -> int:
    first = await add_one(params["x"])
    await ctx.sleep(3600)
    second = await double(first)
    return int(second)


async def test_recorded_step_is_not_executed_again_on_resume(
    store_runner: InlineWorkflowRunner,
) -> None:
    runner = store_runner
    run = await runner.client.submit("steps.then_sleep", {"x": 1})
    events = await runner.run(run.name, run.run_id)
    assert types(events)[-1] == "run:sleeping"
    assert (await runner.client.get(run.run_id)).status is RunStatus.SLEEPING
    assert CALLS == ["add_one"]

    assert await runner.client.wake(run.run_id) is True
    assert (await runner.client.get(run.run_id)).status is RunStatus.QUEUED
    events = await runner.run(run.name, run.run_id)

    assert CALLS == ["add_one", "double"]  # add_one ran once, though the code ran twice
    assert await runner.client.result(run.run_id, timeout=5) == 4
    assert len(of_type(events, "step:started")) == 2
    assert [e["attempt"] for e in of_type(events, "run:started")] == [1, 2]
    assert last(events, "run:woken")["reason"] == "manual"


async def test_run_on_a_parked_run_leaves_it_alone(runner: InlineWorkflowRunner) -> None:
    run = await runner.client.submit("steps.then_sleep", {"x": 1})
    first = await runner.run(run.name, run.run_id)
    again = await runner.run(run.name, run.run_id)

    assert again == first
    assert CALLS == ["add_one"]
    assert (await runner.client.get(run.run_id)).status is RunStatus.SLEEPING


@workflow(name="steps.gather")
async def gather_steps(ctx: WorkflowContext, params: list[int]) -> list[int]:
    results = await asyncio.gather(*(double(x) for x in params))
    await ctx.sleep(60)
    tail = await add_one(sum(results))
    return [*results, tail]


async def test_gathered_steps_run_in_parallel_and_replay_deterministically(
    runner: InlineWorkflowRunner,
) -> None:
    run = await runner.client.submit("steps.gather", [1, 2, 3])
    events = await runner.run(run.name, run.run_id)
    completed = of_type(events, "step:completed")
    assert sorted(e["call"] for e in completed) == [1, 2, 3]
    by_call = {e["call"]: e["result"] for e in completed}
    assert by_call == {1: 2, 2: 4, 3: 6}  # call order is the order the code called them
    assert CALLS == ["double"] * 3

    await runner.client.wake(run.run_id)
    events = await runner.run(run.name, run.run_id)

    assert await runner.client.result(run.run_id, timeout=5) == [2, 4, 6, 13]
    assert CALLS == ["double"] * 3 + ["add_one"]
    assert len(of_type(events, "step:started")) == 4
    assert not of_type(events, "run:error")


@step(timeout=0.05)
async def slow_async() -> str:
    await asyncio.sleep(30)
    return "too late"


RELEASE = threading.Event()


@step(timeout=0.05)
def slow_sync() -> str:
    RELEASE.wait(10)
    return "too late"


@workflow(name="steps.timeouts")
async def timeouts(ctx: WorkflowContext, params: str) -> dict[str, str]:
    try:
        await (slow_async() if params == "async" else slow_sync())
    except StepFailed as exc:
        return {"step": exc.step, "error_type": exc.error_type, "message": exc.message}
    return {"step": "", "error_type": "", "message": "no timeout"}


@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_step_timeout_fails_the_step(runner: InlineWorkflowRunner, kind: str) -> None:
    RELEASE.clear()
    try:
        run = await runner.client.submit("steps.timeouts", kind)
        events = await runner.run(run.name, run.run_id)
    finally:
        RELEASE.set()  # let the abandoned sync step's thread finish

    result = await runner.client.result(run.run_id, timeout=5)
    name = slow_async.__qualname__ if kind == "async" else slow_sync.__qualname__
    assert result["step"] == name
    assert "Timeout" in result["error_type"]
    assert "timed out after 0.05 s" in result["message"]
    failed = last(events, "step:failed")
    assert failed["will_retry"] is False
    assert failed["error_type"] == result["error_type"]


class Opaque:
    pass


@step(retries=3, retry_backoff=0)
def returns_set() -> Any:
    CALLS.append("returns_set")
    return {1, 2}


@step(retries=3, retry_backoff=0)
def returns_object() -> Any:
    CALLS.append("returns_object")
    return {"nested": [Opaque()]}


@workflow(name="steps.unserialisable")
async def unserialisable(ctx: WorkflowContext, params: str) -> Any:
    return await (returns_set() if params == "set" else returns_object())


@pytest.mark.parametrize(
    ("kind", "step_fn", "type_name"),
    [("set", returns_set, "builtins.set"), ("object", returns_object, "Opaque")],
)
async def test_unserialisable_step_result_fails_once_with_a_clear_error(
    runner: InlineWorkflowRunner, kind: str, step_fn: Any, type_name: str
) -> None:
    run = await runner.client.submit("steps.unserialisable", kind)
    events = await runner.run(run.name, run.run_id)

    failed = of_type(events, "step:failed")
    assert len(failed) == 1, "a result that cannot serialise must not be retried"
    assert failed[0]["will_retry"] is False
    assert len(CALLS) == 1
    info = await runner.client.get(run.run_id)
    assert info.status is RunStatus.FAILED
    assert info.error is not None
    assert info.error["code"] == "step_failed"
    name = step_fn.__pyrula_step__.name
    assert name in info.error["message"]
    assert type_name in info.error["message"]
    assert "JSON" in info.error["message"]
    with pytest.raises(RunFailed) as caught:
        await runner.client.result(run.run_id, timeout=5)
    assert caught.value.error["code"] == "step_failed"


@step(retries=3, retry_backoff=0)
def returns_a_lot() -> str:
    CALLS.append("returns_a_lot")
    return "x" * 1000


@workflow(name="steps.too_large")
async def too_large(ctx: WorkflowContext, params: None) -> str:
    return str(await returns_a_lot())


async def test_a_step_result_above_the_payload_limit_fails_once() -> None:
    runner = InlineWorkflowRunner(
        store=MemoryStore(), settings=AttemptSettings(max_payload_bytes=100), cloud=False
    )
    run = await runner.client.submit("steps.too_large")
    events = await runner.run(run.name, run.run_id)
    await runner.aclose()

    assert len(of_type(events, "step:failed")) == 1
    assert CALLS == ["returns_a_lot"]
    error = (await runner.client.get(run.run_id)).error
    assert error is not None and error["code"] == "step_failed"
    assert error["error_type"] == "PayloadTooLarge"
    assert "max_payload_bytes (100)" in error["message"]


@step
def nested_inner(x: int) -> int:
    CALLS.append("nested_inner")
    return x + 100


@step
def nested_outer(x: int) -> int:
    CALLS.append("nested_outer")
    return int(nested_inner(x))  # a step called from a step is the plain function


@workflow(name="steps.nested")
async def nested_steps(ctx: WorkflowContext, params: int) -> int:
    return int(await nested_outer(params))


async def test_step_called_inside_a_step_is_the_plain_function(
    runner: InlineWorkflowRunner,
) -> None:
    run = await runner.client.submit("steps.nested", 1)
    events = await runner.run(run.name, run.run_id)

    assert await runner.client.result(run.run_id, timeout=5) == 101
    assert step_names(events) == ["nested_outer"]
    assert CALLS == ["nested_outer", "nested_inner"]
