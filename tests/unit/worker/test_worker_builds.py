"""A worker whose code cannot replay a run that last ran on another build does not run it
into a NonDeterminismError: with no worker of that build alive it parks the run waiting
for ``pyrula.build`` (``pyrula runs stuck`` lists it), and a worker of the right build
finishes it once signalled."""

from __future__ import annotations

import dataclasses
from typing import Any

from pyrula.workflows import RunStatus, WorkflowContext, WorkflowWorker, step, workflow
from pyrula.workflows.definition import Registry
from tests.conftest import await_until
from tests.unit.worker.worker_support import fast_options, serving


@step(name="wbuild.one")
async def one() -> str:
    return "one"


@step(name="wbuild.uno")
async def uno() -> str:
    return "uno"


@workflow(name="wbuild.flow_v2")
async def flow_v2(ctx: WorkflowContext, params: Any) -> Any:
    return [await uno(), await ctx.wait_for_signal("go")]


@workflow(name="wbuild.flow")
async def flow_v1(ctx: WorkflowContext, params: Any) -> Any:
    return [await one(), await ctx.wait_for_signal("go")]


def _registry(fn: Any, name: str = "wbuild.flow") -> Registry:
    """A registry holding ``fn``'s workflow under ``name``: two versions of one workflow."""
    registry = Registry()
    registry.add_workflow(dataclasses.replace(fn.__pyrula_workflow__, name=name))
    return registry


async def _status(worker: WorkflowWorker, run_id: str) -> tuple[RunStatus, tuple[str, ...]]:
    info = await worker.client.get(run_id)
    return info.status, info.waiting_for


async def test_a_run_no_live_code_can_replay_is_parked_not_failed(store: Any) -> None:
    v1 = WorkflowWorker(store=store, registry=_registry(flow_v1), build="b-one",
                        options=fast_options())
    async with serving(v1):
        run = await v1.client.submit("wbuild.flow", {})
        await await_until(lambda: _parked_on(v1, run.run_id, "go"),
                          what="the run waiting for its signal")

    v2 = WorkflowWorker(store=store, registry=_registry(flow_v2), build="b-two",
                        options=fast_options())
    async with serving(v2):
        await v2.client.signal(run.run_id, "go", "now")
        await await_until(lambda: _parked_on(v2, run.run_id, "pyrula.build"),
                          what="the run parked for want of its build")
    events = await v2.client.events(run.run_id)
    parked = events[-1]
    assert parked["type"] == "run:waiting" and parked["reason"] == "build_mismatch"
    assert parked["build"] == "b-one" and "wbuild.one" in parked["message"]
    assert not any(e["type"] == "run:error" for e in events)

    # The old code again (a rollback): signalled, it finishes the run.
    v1_again = WorkflowWorker(store=store, registry=_registry(flow_v1), build="b-one",
                              options=fast_options())
    async with serving(v1_again):
        await v1_again.client.signal(run.run_id, "pyrula.build", None)
        assert await v1_again.client.result(run.run_id, timeout=10) == ["one", "now"]


async def _parked_on(worker: WorkflowWorker, run_id: str, signal: str) -> bool:
    status, waiting_for = await _status(worker, run_id)
    return status is RunStatus.WAITING and signal in waiting_for


async def test_an_audit_counts_the_open_runs_of_a_build_the_code_cannot_replay(
    store: Any,
) -> None:
    v1 = WorkflowWorker(store=store, registry=_registry(flow_v1), build="b-one",
                        options=fast_options())
    async with serving(v1):
        waiting = [await v1.client.submit("wbuild.flow", {}) for _ in range(3)]
        ended = await v1.client.submit("wbuild.flow", {})
        for run in [*waiting, ended]:
            await await_until(lambda r=run: _parked_on(v1, r.run_id, "go"),
                              what="the run waiting for its signal")
        await v1.client.signal(ended.run_id, "go", 1)
        await await_until(lambda: _ended(v1, ended.run_id), what="one run ended")
    queued = await v1.client.submit("wbuild.flow", {})  # never ran: no build to need

    v2 = WorkflowWorker(store=store, registry=_registry(flow_v2), build="b-two",
                        options=fast_options())
    same = WorkflowWorker(store=store, registry=_registry(flow_v1), build="b-one-again",
                          options=fast_options())
    found = await v2.open_runs_of("b-one")
    assert sorted(found) == sorted(r.run_id for r in waiting)
    assert queued.run_id not in found
    assert await v2.open_runs_of("b-other") == []  # no run last ran on it
    assert await same.open_runs_of("b-one") == []  # this code replays them all


async def _ended(worker: WorkflowWorker, run_id: str) -> bool:
    return (await worker.client.get(run_id)).status is RunStatus.COMPLETED
