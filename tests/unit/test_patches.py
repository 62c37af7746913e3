"""``ctx.patched`` and ``ctx.deprecate_patch``: changing a workflow's code under runs in flight.

First what replay decides for a patch against a journal (pure, table-driven), then the
deploy story on every store: a run parked on the code before a change resumes on the code
with it and keeps to the old branch where its journal says so, a new run takes the new
branch, and once the patch is deprecated the runs that took it still replay.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from pyrula.workflows import InlineWorkflowRunner, RunStatus, WorkflowContext, step
from pyrula.workflows.compat import Stop, replays_cleanly
from pyrula.workflows.definition import REGISTRY, WorkflowSpec
from pyrula.workflows.errors import NonDeterminismError
from pyrula.workflows.replay import Replay, patch_applied
from tests.unit.test_engine_replay import T0, completed, journal, waiting

Event = dict[str, Any]


def marker(call: int, patch_id: str) -> Event:
    return patch_applied(T0, call, patch_id)


def replay_of(*events: Event) -> Replay:
    return Replay(journal(*events), workflow="billing.invoice", run_id="run-1")


# --- what replay decides ------------------------------------------------------------------


@dataclass(frozen=True)
class PatchCase:
    id: str
    recorded: tuple[Event, ...]
    #: What ``patched("fee")`` answers, and the call of the marker it writes (None: none).
    applied: bool
    writes_at: int | None
    #: The call index the code's next operation takes after it.
    next_call: int
    #: Calls the code replayed before it asks.
    replayed: int = 0


PATCH_CASES = [
    PatchCase("a new run records the marker", (), True, 1, 2),
    PatchCase("a run past its journal records the marker",
              (completed(1, "price", 10),), True, 2, 3, replayed=1),
    PatchCase("the marker at this call replays", (marker(1, "fee"),), True, None, 2),
    PatchCase("a run recorded before the patch keeps to the old branch",
              (completed(1, "price", 10),), False, None, 1),
    PatchCase("a run parked before the patch keeps to the old branch",
              (waiting(1, "approved"),), False, None, 1),
    PatchCase("another patch's marker is not this one's",
              (marker(1, "rounding"),), False, None, 1),
]


@pytest.mark.parametrize("case", PATCH_CASES, ids=lambda c: c.id)
def test_replaying_a_patch(case: PatchCase) -> None:
    replay = replay_of(*case.recorded)
    for _ in range(case.replayed):
        replay.take_call()
    applied, written = replay.patch("fee", T0)
    assert applied is case.applied
    if case.writes_at is None:
        assert written is None
    else:
        assert written == marker(case.writes_at, "fee")
    assert replay.take_call() == case.next_call


@pytest.mark.parametrize("recorded", [(), (completed(1, "price", 10),)])
def test_a_patch_answers_the_same_every_time_in_a_run(recorded: tuple[Event, ...]) -> None:
    replay = replay_of(*recorded)
    first, _ = replay.patch("fee", T0)
    taken = replay.calls_taken
    again, written = replay.patch("fee", T0)
    assert (again, written, replay.calls_taken) == (first, None, taken)


def test_a_deprecated_patch_skips_its_marker_and_records_nothing() -> None:
    replay = replay_of(marker(1, "fee"), completed(2, "fee", 2))
    replay.deprecated_patch("fee")
    assert replay.step(replay.take_call(), "fee").result == 2

    fresh = replay_of()
    fresh.deprecated_patch("fee")
    assert fresh.take_call() == 1
    assert fresh.journal == journal()


def test_code_without_the_patch_at_its_marker_is_non_deterministic() -> None:
    replay = replay_of(marker(1, "fee"), completed(2, "fee", 2))
    with pytest.raises(NonDeterminismError, match=r"marker of patch 'fee' at call 1"):
        replay.step(replay.take_call(), "fee")


# --- the deploy story, on every store ----------------------------------------------------

RAN: list[str] = []


@step(name="patches.price")
def price(items: list[int]) -> int:
    RAN.append("price")
    return sum(items)


@step(name="patches.fee")
def fee() -> float:
    RAN.append("fee")
    return 2.5


async def invoice_v1(ctx: WorkflowContext, params: dict[str, Any]) -> dict[str, Any]:
    subtotal = await price(params["items"])
    await ctx.wait_for_signal("approved")
    return {"total": subtotal}


async def invoice_v2(ctx: WorkflowContext, params: dict[str, Any]) -> dict[str, Any]:
    subtotal = await price(params["items"])
    extra = await fee() if ctx.patched("add-fee") else 0.0
    await ctx.wait_for_signal("approved")
    total = subtotal + extra
    if ctx.patched("round-total"):  # past where old runs parked: every run reaches it anew
        total = round(total)
    return {"total": total, "fee": ctx.patched("add-fee")}


async def invoice_v3(ctx: WorkflowContext, params: dict[str, Any]) -> dict[str, Any]:
    subtotal = await price(params["items"])
    ctx.deprecate_patch("add-fee")
    extra = await fee()
    await ctx.wait_for_signal("approved")
    total = subtotal + extra
    if ctx.patched("round-total"):
        total = round(total)
    return {"total": total, "fee": True}


@pytest.fixture
def deploy() -> Iterator[Callable[[Callable[..., Any]], str]]:
    """Deploy a version of the workflow ``patches.invoice`` (the registry's last wins)."""
    name = "patches.invoice"

    def to(fn: Callable[..., Any]) -> str:
        REGISTRY.add_workflow(WorkflowSpec(name, fn))
        return name

    RAN.clear()
    yield to


async def _approve(runner: InlineWorkflowRunner, run_id: str) -> Any:
    await runner.client.signal(run_id, "approved", True)
    await runner.run("patches.invoice", run_id)
    info = await runner.client.get(run_id)
    assert info.status is RunStatus.COMPLETED, info.error
    return info.result


def _markers(events: list[Event]) -> list[tuple[int, str]]:
    return [(e["call"], e["patch"]) for e in events if e["type"] == "patch:applied"]


async def test_a_run_parked_on_old_code_keeps_to_the_old_branch(
    store_runner: InlineWorkflowRunner, deploy: Callable[[Callable[..., Any]], str]
) -> None:
    runner = store_runner
    name = deploy(invoice_v1)
    old = await runner.client.submit(name, {"items": [3, 4.25]})
    await runner.run(name, old.run_id)

    deploy(invoice_v2)
    new = await runner.client.submit(name, {"items": [3, 4.25]})
    await runner.run(name, new.run_id)
    assert await _approve(runner, old.run_id) == {"total": 7, "fee": False}
    assert await _approve(runner, new.run_id) == {"total": 10, "fee": True}
    assert RAN == ["price", "price", "fee"], "the old run ran no fee step"
    old_events = await runner.client.events(old.run_id)
    assert _markers(old_events) == [(3, "round-total")]
    assert _markers(await runner.client.events(new.run_id)) == [
        (2, "add-fee"), (5, "round-total")
    ]


async def test_runs_that_took_a_deprecated_patch_still_replay(
    store_runner: InlineWorkflowRunner, deploy: Callable[[Callable[..., Any]], str]
) -> None:
    runner = store_runner
    name = deploy(invoice_v2)
    took = await runner.client.submit(name, {"items": [3, 4.25]})
    await runner.run(name, took.run_id)

    deploy(invoice_v3)
    new = await runner.client.submit(name, {"items": [1]})
    await runner.run(name, new.run_id)
    assert await _approve(runner, took.run_id) == {"total": 10, "fee": True}
    assert await _approve(runner, new.run_id) == {"total": 4, "fee": True}
    assert RAN == ["price", "fee", "price", "fee"], "no recorded step ran again"
    assert _markers(await runner.client.events(new.run_id)) == [(4, "round-total")]


async def test_the_replay_check_follows_the_patch(
    runner: InlineWorkflowRunner, deploy: Callable[[Callable[..., Any]], str]
) -> None:
    name = deploy(invoice_v1)
    old = await runner.client.submit(name, {"items": [1]})
    await runner.run(name, old.run_id)
    old_journal = await runner.client.events(old.run_id)
    deploy(invoice_v2)
    marked = await runner.client.submit(name, {"items": [1]})
    await runner.run(name, marked.run_id)
    marked_journal = await runner.client.events(marked.run_id)

    assert replays_cleanly(WorkflowSpec(name, invoice_v2), old_journal).stop is Stop.FRONTIER
    assert replays_cleanly(WorkflowSpec(name, invoice_v3), marked_journal).ok
    verdict = replays_cleanly(WorkflowSpec(name, invoice_v1), marked_journal)
    assert not verdict.ok and "marker of patch 'add-fee'" in str(verdict.reason)


@pytest.mark.parametrize("bad", ["", None, 7])
async def test_a_patch_id_must_be_a_non_empty_str(
    runner: InlineWorkflowRunner, deploy: Callable[[Callable[..., Any]], str], bad: Any
) -> None:
    async def patched_badly(ctx: WorkflowContext, params: Any) -> bool:
        return ctx.patched(bad)

    name = deploy(patched_badly)
    run = await runner.client.submit(name)
    await runner.run(name, run.run_id)
    info = await runner.client.get(run.run_id)
    assert info.status is RunStatus.FAILED
    assert info.error is not None
    assert f"patch id must be a non-empty str, got {bad!r}" in info.error["message"]
