"""Why an attempt stops, when several reasons come: the strongest wins, not the first.

The table pins the order the attempt loop has always acted in (a lost lock or a gone
store, then a stand-down, a cancel, a divergence); the tests after it drive real attempts
over a memory store to the outcome that order gives.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import pytest

from pyrula.workflows import InlineWorkflowRunner, RunStatus, WorkflowContext, step, workflow
from pyrula.workflows.definition import REGISTRY
from pyrula.workflows.engine import Attempt, OutcomeKind
from pyrula.workflows.errors import NonDeterminismError
from pyrula.workflows.stop import Halt, Stop, StopReason, StopState
from tests.conftest import await_until

FIRST = NonDeterminismError("first divergence")
SECOND = NonDeterminismError("second divergence")

ASKS = {
    "lost": Stop.lost(),
    "store_unavailable": Stop.store_unavailable(),
    "stand_down": Stop.stand("shutdown"),
    "stand_down_again": Stop.stand("suspect", crash=True, exit=9),
    "cancel": Stop.cancel(),
    "divergence": Stop.non_determinism(FIRST),
    "divergence_again": Stop.non_determinism(SECOND),
    "ending": Stop.ending(),
    "hand_back": Stop.hand_back("upgrade"),
}


@dataclass(frozen=True)
class Case:
    id: str
    asks: tuple[str, ...]
    reason: StopReason
    refuses: bool


CASES = [
    Case("a stand-down after a cancel requeues the run", ("cancel", "stand_down"),
         StopReason.STAND_DOWN, refuses=True),
    Case("a cancel after a stand-down still requeues it", ("stand_down", "cancel"),
         StopReason.STAND_DOWN, refuses=True),
    Case("a lost lock wins over a stand-down", ("stand_down", "lost"), StopReason.LOST, False),
    Case("a stand-down after a lost lock changes nothing", ("lost", "stand_down"),
         StopReason.LOST, False),
    Case("a cancel wins over a divergence", ("divergence", "cancel"), StopReason.CANCEL, True),
    Case("a divergence after a cancel changes nothing", ("cancel", "divergence"),
         StopReason.CANCEL, True),
    Case("the store's latest answer on the lock wins: lost",
         ("store_unavailable", "lost"), StopReason.LOST, False),
    Case("the store's latest answer on the lock wins: gone",
         ("lost", "store_unavailable"), StopReason.STORE_UNAVAILABLE, False),
    Case("the attempt's end refuses new operations and keeps the reason",
         ("divergence", "ending"), StopReason.NON_DETERMINISM, True),
    Case("a lost lock after the end halts writes and still refuses",
         ("ending", "lost"), StopReason.LOST, True),
    Case("a lost lock alone refuses nothing (a new step checks the halt)", ("lost",),
         StopReason.LOST, False),
    Case("a stand-down alone lets the code go on until the loop's turn", ("stand_down",),
         StopReason.STAND_DOWN, False),
    Case("a hand-back refuses new steps at once", ("hand_back",), StopReason.STAND_DOWN, True),
    Case("a lost lock wins over a hand-back", ("hand_back", "lost"), StopReason.LOST, True),
]


def test_a_stand_down_that_cuts_steps_short_overrides_a_hand_back() -> None:
    state = StopState()
    state.ask(ASKS["hand_back"])
    state.ask(ASKS["stand_down"])
    stop = state.current
    assert stop is not None and stop.stand_down is not None
    assert (stop.stand_down.reason, stop.at_boundary, stop.refuses) == ("shutdown", False, True)
    state.ask(ASKS["hand_back"])  # and a later hand-back does not wait again
    assert state.current is stop


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_which_stop_wins(case: Case) -> None:
    state = StopState()
    for ask in case.asks:
        state.ask(ASKS[ask])
    stop = state.current
    assert stop is not None
    assert (stop.reason, stop.refuses, state.refuses) == (case.reason, case.refuses, case.refuses)


def test_of_two_stand_downs_the_first_reason_is_kept() -> None:
    state = StopState()
    state.ask(ASKS["stand_down"])
    state.ask(ASKS["stand_down_again"])
    assert state.current is not None and state.current.stand_down is not None
    assert state.current.stand_down.reason == "shutdown"
    assert not state.current.stand_down.crash


def test_of_two_divergences_the_run_fails_with_the_first() -> None:
    state = StopState()
    state.ask(ASKS["divergence"])
    state.ask(ASKS["divergence_again"])
    assert state.current is not None and state.current.error is FIRST


def test_only_a_halt_stops_writes() -> None:
    state = StopState()
    for ask in ("stand_down", "cancel", "divergence", "ending"):
        state.ask(ASKS[ask])
        state.raise_if_halted()
    state.ask(ASKS["store_unavailable"])
    with pytest.raises(Halt):
        state.raise_if_halted()


# --- the outcome of a real attempt ---------------------------------------------------------


@workflow(name="engine.stop.sleeper")
async def sleeper(ctx: WorkflowContext, params: None) -> None:
    await ctx.sleep(3600)


async def _claimed(runner: InlineWorkflowRunner) -> tuple[str, Attempt]:
    run = await runner.client.submit("engine.stop.sleeper")
    claimed = await runner.store.claim_run(run.run_id, "worker-1", now=time.time(), lock_ttl=60)
    assert claimed is not None
    spec = REGISTRY.workflow("engine.stop.sleeper")
    return run.run_id, Attempt(spec, claimed, claimed.journal, runner.store)


@pytest.mark.parametrize(
    ("asks", "kind", "status"),
    [
        (("cancel",), OutcomeKind.CANCELLED, RunStatus.CANCELLED),
        (("cancel", "stand_down"), OutcomeKind.REQUEUED, RunStatus.QUEUED),
        (("stand_down", "cancel"), OutcomeKind.REQUEUED, RunStatus.QUEUED),
        (("stand_down", "abandon"), OutcomeKind.LOST, RunStatus.RUNNING),
        (("abandon", "cancel"), OutcomeKind.LOST, RunStatus.RUNNING),
    ],
    ids=["a cancel alone cancels", "a stand-down after a cancel requeues",
         "a cancel after a stand-down requeues", "a lost lock after a stand-down writes nothing",
         "a cancel after a lost lock writes nothing"],
)
async def test_the_outcome_when_stops_come_before_the_loop_looks(
    runner: InlineWorkflowRunner, asks: tuple[str, ...], kind: OutcomeKind, status: RunStatus,
) -> None:
    run_id, attempt = await _claimed(runner)
    for ask in asks:
        if ask == "cancel":
            attempt.request_cancel()
        elif ask == "stand_down":
            attempt.stand_down("shutdown")
        else:
            attempt.abandon()
    # Held at admission (the worker's gate), so the code never starts: the attempt loop's
    # first look decides.
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    outcome = await attempt.run(admission=gate)
    assert outcome.kind is kind
    assert (await runner.client.get(run_id)).status is status


STEP_GATE: dict[str, asyncio.Event] = {}
STARTED: list[str] = []


@step(name="engine.stop.held")
async def held_step(key: str) -> str:
    STARTED.append(key)
    await STEP_GATE[key].wait()
    return key


@workflow(name="engine.stop.two_steps")
async def two_steps(ctx: WorkflowContext, params: dict[str, str]) -> list[str]:
    first = await held_step(params["first"])
    return [first, await held_step(params["second"])]


async def test_a_hand_back_lets_the_running_step_finish_and_starts_no_other(
    runner: InlineWorkflowRunner,
) -> None:
    STEP_GATE["hb1"], STEP_GATE["hb2"] = asyncio.Event(), asyncio.Event()
    run = await runner.client.submit("engine.stop.two_steps", {"first": "hb1", "second": "hb2"})
    claimed = await runner.store.claim_run(run.run_id, "worker-1", now=time.time(), lock_ttl=60)
    assert claimed is not None
    attempt = Attempt(REGISTRY.workflow("engine.stop.two_steps"), claimed, claimed.journal,
                      runner.store)
    task = asyncio.create_task(attempt.run())
    await await_until(lambda: "hb1" in STARTED, what="the first step running")
    attempt.hand_back("upgrade")
    await asyncio.sleep(0)
    assert not task.done()  # the step is not cut
    STEP_GATE["hb1"].set()
    outcome = await asyncio.wait_for(task, 10)
    assert (outcome.kind, outcome.reason) == (OutcomeKind.REQUEUED, "upgrade")
    assert "hb2" not in STARTED
    events = await runner.client.events(run.run_id)
    assert [e["type"] for e in events if e["type"].startswith("step:")] == [
        "step:started", "step:completed"]
    assert events[-1]["type"] == "run:requeued" and events[-1]["reason"] == "upgrade"
    assert (await runner.client.get(run.run_id)).status is RunStatus.QUEUED
