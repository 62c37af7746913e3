"""When the claim loop claims: at once on a store's doorbell, within a second or so when a
ring is lost, promptly out of a wait when the worker stops, and in batches under a backlog."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from pyrula.workflows import MemoryStore, WorkflowContext, WorkflowWorker, workflow
from tests.unit.worker.worker_support import Spy, fast_options, serving, start, stop


@workflow(name="wwake_quick")
async def wwake_quick(ctx: WorkflowContext, params: Any) -> Any:
    return "done"


@workflow(name="wwake_nap")
async def wwake_nap(ctx: WorkflowContext, params: Any) -> Any:
    await asyncio.sleep(params["s"])
    return "done"


class Bell:
    """Gives a MemoryStore a doorbell (the ``Doorbell`` capability): submit rings it unless
    ``ringing`` is off, as a ring lost on the way would be."""

    def __init__(self, store: MemoryStore) -> None:
        self.ringing = True
        self.waits = 0
        self.names: set[tuple[str, ...]] = set()
        self._rung = asyncio.Event()
        self._submit = store.submit
        store.submit = self._submit_and_ring  # type: ignore[method-assign]
        store.wait_for_work = self.wait_for_work  # type: ignore[attr-defined]

    async def _submit_and_ring(self, *args: Any, **kwargs: Any) -> Any:
        result = await self._submit(*args, **kwargs)
        if self.ringing:
            self._rung.set()
        return result

    async def wait_for_work(self, names: Any, timeout: float) -> bool:
        self.waits += 1
        self.names.add(tuple(names))
        try:
            await asyncio.wait_for(self._rung.wait(), timeout)
        except TimeoutError:
            return False
        self._rung.clear()
        return True


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
