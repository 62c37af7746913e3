"""When the claim loop claims: at once on a store's doorbell, within a second or so when a
ring is lost, promptly out of a wait when the worker stops, and in batches under a backlog."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from pyrula.workflows import MemoryStore, WorkflowContext, WorkflowWorker, workflow
from tests.conftest import await_until
from tests.unit.worker.worker_support import (
    Bell,
    Spy,
    capture,
    claim_cut,
    fast_options,
    serving,
    start,
    stop,
)


@workflow(name="wwake_quick")
async def wwake_quick(ctx: WorkflowContext, params: Any) -> Any:
    return "done"


@workflow(name="wwake_nap")
async def wwake_nap(ctx: WorkflowContext, params: Any) -> Any:
    await asyncio.sleep(params["s"])
    return "done"


GATES: dict[str, asyncio.Event] = {}


@workflow(name="wwake_gated")
async def wwake_gated(ctx: WorkflowContext, params: Any) -> Any:
    await GATES[params["gate"]].wait()
    return "done"


async def claimed_after(worker: WorkflowWorker, bell: Bell) -> float:
    """Seconds from a submit (once the idle claim loop waits on the bell) to its result."""
    while bell.waits == 0:
        await asyncio.sleep(0.005)
    began = time.monotonic()
    run = await worker.client.submit(wwake_quick, {})
    assert await worker.client.result(run.run_id, timeout=30) == "done"
    return time.monotonic() - began


async def test_a_ring_wakes_the_claim_loop_however_long_its_poll() -> None:
    store = MemoryStore()
    bell = Bell(store)
    worker = WorkflowWorker(store=store, workflows=[wwake_quick],
                            options=fast_options(claim_poll_interval=30.0))
    async with serving(worker):
        assert await claimed_after(worker, bell) < 5.0
    assert bell.names == {("wwake_quick",)}, "the bell is asked for the served names"


async def test_without_a_ring_the_claim_looks_again_within_about_a_second() -> None:
    store = MemoryStore()
    bell = Bell(store)
    bell.ringing = False
    worker = WorkflowWorker(store=store, workflows=[wwake_quick],
                            options=fast_options(claim_poll_interval=0.05))
    async with serving(worker):
        assert await claimed_after(worker, bell) < 1.8


async def test_an_idle_claim_loop_waits_on_its_doorbell_not_on_the_store() -> None:
    """Waits of claim_poll_interval (50 ms) on the bell, a claim about once a second; and
    each wait counts as the loop turning (a fleet's stall watchdog reads its age)."""
    store = MemoryStore()
    bell = Bell(store)
    spy = Spy(store, "claim")
    worker = WorkflowWorker(store=store, workflows=[wwake_quick],
                            options=fast_options(claim_poll_interval=0.05))
    async with serving(worker):
        await asyncio.sleep(0.6)
        assert bell.waits >= 3
        assert spy.count("claim") <= 2
        assert worker.claim_tick_age() < 0.5


async def test_a_worker_waiting_on_its_doorbell_stops_at_once() -> None:
    store = MemoryStore()
    bell = Bell(store)
    worker = WorkflowWorker(store=store, workflows=[wwake_quick],
                            options=fast_options(claim_poll_interval=30.0))
    task = await start(worker)
    while bell.waits == 0:
        await asyncio.sleep(0.005)
    began = time.monotonic()
    await stop(worker, task)
    assert time.monotonic() - began < 5.0


async def test_under_a_backlog_a_claim_waits_for_a_quarter_of_the_slots() -> None:
    """Eight slots, forty runs queued that end one after another: after the first full
    claim, each claim waits for two free slots (a quarter) instead of making one store
    round trip per finished run."""
    store = MemoryStore()
    spy = Spy(store, "claim")
    worker = WorkflowWorker(store=store, workflows=[wwake_nap],
                            options=fast_options(max_concurrent_runs=8,
                                                 claim_poll_interval=2.0))
    runs = [await worker.client.submit(wwake_nap, {"s": 0.01 * (1 + n % 8)})
            for n in range(40)]
    async with serving(worker):
        for run in runs:
            assert await worker.client.result(run.run_id, timeout=30) == "done"
    batches = [(kwargs["limit"], len(claimed)) for _, kwargs, claimed in spy.of("claim")]
    taking = [limit for limit, got in batches if got]
    assert taking[0] == 8
    assert min(taking) >= 2, batches
    assert max(limit for limit, _ in batches) <= 8, "never more than the free slots"
    assert sum(got for _, got in batches) == 40


async def test_a_worker_with_one_slot_claims_the_next_run_as_its_slot_frees() -> None:
    """No poll interval (30 s here) between runs: the freed slot wakes the claim."""
    store = MemoryStore()
    spy = Spy(store, "claim")
    worker = WorkflowWorker(store=store, workflows=[wwake_quick],
                            options=fast_options(max_concurrent_runs=1,
                                                 claim_poll_interval=30.0))
    runs = [await worker.client.submit(wwake_quick, {}) for _ in range(3)]
    began = time.monotonic()
    async with serving(worker):
        for run in runs:
            assert await worker.client.result(run.run_id, timeout=30) == "done"
        assert time.monotonic() - began < 1.5
    assert {kwargs["limit"] for _, kwargs, _ in spy.of("claim")} == {1}


async def test_a_full_worker_asks_the_store_for_no_run_until_a_slot_frees() -> None:
    """While its one slot is taken (half a second), no claim is sent, not even for none."""
    store = MemoryStore()
    spy = Spy(store, "claim")
    worker = WorkflowWorker(store=store, workflows=[wwake_nap],
                            options=fast_options(max_concurrent_runs=1,
                                                 claim_poll_interval=0.01))
    runs = [await worker.client.submit(wwake_nap, {"s": 0.5}) for _ in range(2)]
    async with serving(worker):
        for run in runs:
            assert await worker.client.result(run.run_id, timeout=30) == "done"
    assert {kwargs["limit"] for _, kwargs, _ in spy.of("claim")} == {1}


async def test_under_a_backlog_a_slot_that_frees_alone_is_used_after_a_moment() -> None:
    """Eight slots taken by a full claim, then one run ends and the seven others go on: the
    claim waits a moment (a quarter of the 4 s poll) for a quarter of the slots, then takes
    the next run into the one that is free, however long the others last."""
    store = MemoryStore()
    GATES.update(first=asyncio.Event(), rest=asyncio.Event())
    worker = WorkflowWorker(store=store, workflows=[wwake_gated, wwake_quick],
                            options=fast_options(max_concurrent_runs=8,
                                                 claim_poll_interval=4.0))
    first = await worker.client.submit(wwake_gated, {"gate": "first"})
    rest = [await worker.client.submit(wwake_gated, {"gate": "rest"}) for _ in range(7)]
    async with serving(worker):
        await await_until(lambda: worker.in_flight == 8, what="every slot taken")
        following = await worker.client.submit(wwake_quick, {})
        GATES["first"].set()
        assert await worker.client.result(first.run_id, timeout=10) == "done"
        assert await worker.client.result(following.run_id, timeout=10) == "done"
        assert worker.in_flight == 7
        GATES["rest"].set()
        for run in rest:
            assert await worker.client.result(run.run_id, timeout=10) == "done"


def gated_worker(slots: int, poll: float) -> tuple[MemoryStore, WorkflowWorker]:
    store = MemoryStore()
    Bell(store)  # a submit wakes the claim at once, not after the (long) poll
    worker = WorkflowWorker(store=store, workflows=[wwake_gated, wwake_quick],
                            options=fast_options(max_concurrent_runs=slots,
                                                 claim_poll_interval=poll))
    return store, worker


async def fill(worker: WorkflowWorker, gates: list[str]) -> list[Any]:
    """One run held per gate (a full claim when they fill every slot)."""
    for gate in gates:
        GATES[gate] = asyncio.Event()
    runs = [await worker.client.submit(wwake_gated, {"gate": gate}) for gate in gates]
    return runs


async def release(worker: WorkflowWorker, runs: list[Any], gates: list[str]) -> None:
    for gate in gates:
        GATES[gate].set()
    for run in runs:
        assert await worker.client.result(run.run_id, timeout=10) == "done"


async def test_under_a_backlog_a_quarter_of_the_slots_free_is_claimed_into_at_once() -> None:
    """Five slots: one is a quarter (5 // 4), so the slot a run frees is claimed into at
    once, without the backlog's wait (a quarter of the 40 s poll)."""
    _, worker = gated_worker(5, 40.0)
    gates = [f"q{i}" for i in range(5)]
    runs = await fill(worker, gates)
    async with serving(worker):
        await await_until(lambda: worker.in_flight == 5, what="every slot taken")
        following = await worker.client.submit(wwake_quick, {})
        GATES["q0"].set()
        assert await worker.client.result(following.run_id, timeout=5) == "done"
        await release(worker, runs, gates)


async def test_under_a_backlog_the_claim_goes_once_a_quarter_of_the_slots_is_free() -> None:
    """Eight slots: after one run ends the claim waits for a second (a quarter), and claims
    as soon as that one ends too, not after the backlog's wait (a quarter of 40 s)."""
    _, worker = gated_worker(8, 40.0)
    gates = [f"h{i}" for i in range(8)]
    runs = await fill(worker, gates)
    async with serving(worker):
        await await_until(lambda: worker.in_flight == 8, what="every slot taken")
        following = await worker.client.submit(wwake_quick, {})
        GATES["h0"].set()
        assert await worker.client.result(runs[0].run_id, timeout=10) == "done"
        GATES["h1"].set()
        assert await worker.client.result(following.run_id, timeout=5) == "done"
        await release(worker, runs, gates)


async def test_without_a_backlog_a_run_is_claimed_into_the_last_free_slot_at_once() -> None:
    """Seven runs claimed into eight slots (not a full batch, so no backlog): a run submitted
    then is claimed on the ring into the free slot, without the backlog's wait for a
    quarter of the slots (10 s, a quarter of the 40 s poll)."""
    _, worker = gated_worker(8, 40.0)
    gates = [f"p{i}" for i in range(7)]
    runs = await fill(worker, gates)
    async with serving(worker):
        await await_until(lambda: worker.in_flight == 7, what="seven runs held")
        following = await worker.client.submit(wwake_quick, {})
        assert await worker.client.result(following.run_id, timeout=5) == "done"
        await release(worker, runs, gates)


async def test_a_full_worker_stops_without_waiting_for_a_free_slot(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Its claim loop waits for a slot or the stop: it ends at once, not when the shutdown
    gives up on it (after the grace)."""
    capture(caplog)
    store, worker = gated_worker(1, 40.0)
    [run] = await fill(worker, ["full"])
    task = await start(worker)
    await await_until(lambda: worker.in_flight == 1, what="the slot taken")
    await stop(worker, task, deadline=20)
    assert not claim_cut(caplog)
    assert (await worker.client.get(run.run_id)).status == "queued"  # put back at shutdown
    GATES["full"].set()


async def test_a_worker_stopped_while_its_claim_waits_under_a_backlog_stops(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Twelve slots (a quarter is three), one free under a backlog, so the claim waits for
    more (up to 30 s, a quarter of the 120 s poll). Stopped meanwhile, the worker stops
    without the shutdown giving up on its claim (after the grace), and a run that ends
    meanwhile completes."""
    capture(caplog)
    _, worker = gated_worker(12, 120.0)
    gates = [f"s{i}" for i in range(12)]
    runs = await fill(worker, gates)
    task = await start(worker)
    await await_until(lambda: worker.in_flight == 12, what="every slot taken")
    GATES["s0"].set()
    assert await worker.client.result(runs[0].run_id, timeout=10) == "done"
    worker.stop()
    GATES["s1"].set()
    await asyncio.wait_for(task, 20)
    assert not claim_cut(caplog)
    assert (await worker.client.get(runs[1].run_id)).status == "completed"
    for gate in gates:
        GATES[gate].set()


async def test_the_claim_tick_age_reads_as_an_age_at_any_moment() -> None:
    """Read at every turn of the event loop while the worker starts, claims and serves
    (as a fleet child's heartbeat may read it at any one): always a number of seconds."""
    store = MemoryStore()
    worker = WorkflowWorker(store=store, workflows=[wwake_quick],
                            options=fast_options(claim_poll_interval=0.01))
    ages: list[float] = []
    task = asyncio.create_task(worker.run())
    run = await worker.client.submit(wwake_quick, {})
    while (await worker.client.get(run.run_id)).status != "completed":
        ages.append(worker.claim_tick_age())
        await asyncio.sleep(0)
    for _ in range(200):
        ages.append(worker.claim_tick_age())
        await asyncio.sleep(0)
    await stop(worker, task)
    assert all(isinstance(age, float) and age >= 0 for age in ages)
