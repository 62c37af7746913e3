"""What a worker tells its supervisor about the runs inside their own code, and how it runs
suspects (runs with a crash counted against them) apart.

The supervisor charges a dead child's crash to the runs its last report named in user
code, or, if a suspect was among them, to that suspect alone. So the report must name every
run before any of its code runs, must not name a run whose body waits on the store, and a
worker runs a suspect alone: it holds no other run while the suspect's attempt lasts.
``Reporter`` plays the child and its supervisor: it keeps the last report, as the
supervisor would read it after a crash.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from pyrula.workflows import (
    RunStatus,
    WorkflowClient,
    WorkflowContext,
    WorkflowWorker,
    step,
    step_info,
    workflow,
)
from pyrula.workflows.records import PoisonPolicy
from tests.conftest import await_until
from tests.unit.worker.worker_support import fast_options, of_type, serving


class Reporter:
    """Sends the worker's reports (claims, entries, heartbeats) and keeps the last one."""

    def __init__(self) -> None:
        self.worker: WorkflowWorker | None = None
        self.user_code: frozenset[str] = frozenset()
        self.suspects: frozenset[str] = frozenset()
        self.lock = threading.Lock()

    def claimed(self, _: dict[str, int]) -> None:
        self.send(heartbeat=False)

    def entering(self) -> None:
        self.send(heartbeat=False)

    def send(self, *, heartbeat: bool) -> None:
        assert self.worker is not None
        user_code, suspects = self.worker.user_code_report(heartbeat=heartbeat)
        with self.lock:
            self.user_code, self.suspects = frozenset(user_code), frozenset(suspects)

    def names(self, run_id: str) -> bool:
        with self.lock:
            return run_id in self.user_code

    async def beat(self) -> None:
        """The periodic heartbeat (often, so that runs keep dropping out of the report)."""
        while True:
            self.send(heartbeat=True)
            await asyncio.sleep(0.003)


REPORTER: list[Reporter] = []
UNREPORTED: list[str] = []  # code that ran while the last report did not name its run


def _check(where: str, run_id: str | None = None) -> None:
    if run_id is None:
        info = step_info()
        assert info is not None
        run_id = info.run_id
    if not REPORTER[-1].names(run_id):
        UNREPORTED.append(f"{where} of {run_id}")


@step(name="wsusp_sync")
def sync_part(tag: str) -> str:
    _check("sync step")
    time.sleep(0.002)
    _check("sync step")
    return tag


@step(name="wsusp_async")
async def async_part(tag: str) -> str:
    _check("async step")
    await asyncio.sleep(0.002)
    _check("async step")
    return tag


@workflow(name="wsusp_mixed")
async def mixed(ctx: WorkflowContext, params: Any) -> Any:
    _check("body", ctx.run_id)
    a = await sync_part("a")
    _check("body", ctx.run_id)
    b = await async_part("b")
    _check("body", ctx.run_id)
    c, d = await asyncio.gather(sync_part("c"), async_part("d"))
    _check("body", ctx.run_id)
    await ctx.sleep(0.05)
    _check("body", ctx.run_id)
    return [a, b, c, d, await sync_part("e")]


def reporting_worker(store: Any, workflows: list[Any], **options: Any) -> WorkflowWorker:
    reporter = Reporter()
    REPORTER.append(reporter)
    worker = WorkflowWorker(store=store, workflows=workflows, options=fast_options(**options),
                            on_claimed=reporter.claimed, on_user_code=reporter.entering)
    reporter.worker = worker
    return worker


async def test_every_run_is_reported_before_any_of_its_code_runs(store: Any) -> None:
    UNREPORTED.clear()
    client = WorkflowClient(store)
    runs = [await client.submit(mixed, {}) for _ in range(20)]
    worker = reporting_worker(store, [mixed], max_concurrent_runs=10)
    async with serving(worker):
        beating = asyncio.create_task(REPORTER[-1].beat())
        try:
            for run in runs:
                assert await worker.client.result(run.run_id, timeout=30) == list("abcde")
        finally:
            beating.cancel()
    assert UNREPORTED == []


@workflow(name="wsusp_steps")
async def steps(ctx: WorkflowContext, params: Any) -> Any:
    first = await sync_part("a")
    await ctx.sleep(0.01)
    return [first, await async_part("b")]


async def test_a_run_whose_body_waits_on_the_store_is_not_in_user_code(store: Any) -> None:
    UNREPORTED.clear()
    worker = reporting_worker(store, [steps])
    seen: list[tuple[str, bool]] = []
    for method in ("append", "park", "finish"):
        real = getattr(store, method)

        def spy(real: Any = real, method: str = method) -> Any:
            async def call(run_id: str, *args: Any, **kwargs: Any) -> Any:
                # A heartbeat sent now would name exactly the runs in user code.
                in_code, _ = worker.user_code_report(heartbeat=True)
                seen.append((method, run_id in in_code))
                return await real(run_id, *args, **kwargs)
            return call

        setattr(store, method, spy())
    run = await WorkflowClient(store).submit(steps, {})
    async with serving(worker):
        assert await worker.client.result(run.run_id, timeout=30) == ["a", "b"]
    assert {m for m, _ in seen} == {"append", "park", "finish"}
    assert [m for m, in_code in seen if in_code] == []
    assert UNREPORTED == []


IN_CODE: dict[str, Any] = {"now": set(), "alone": [], "beside": 0, "most": 0}
WORKERS: list[WorkflowWorker] = []


@step(name="wsusp_dwell")
async def dwell(tag: str, suspect: bool) -> str:
    info = step_info()
    assert info is not None
    IN_CODE["now"].add(info.run_id)
    IN_CODE["most"] = max(IN_CODE["most"], len(IN_CODE["now"]))
    try:
        if suspect:
            # Alone: the worker holds no other run, so no other code runs beside it.
            reporter = REPORTER[-1]
            IN_CODE["alone"].append((WORKERS[-1].in_flight, set(IN_CODE["now"]),
                                     reporter.suspects, reporter.names(info.run_id)))
            await asyncio.sleep(0.02)
        else:
            await asyncio.sleep(0.05)
            IN_CODE["beside"] = max(IN_CODE["beside"], len(IN_CODE["now"]))
    finally:
        IN_CODE["now"].discard(info.run_id)
    return tag


@workflow(name="wsusp_dwelling")
async def dwelling(ctx: WorkflowContext, params: Any) -> Any:
    return await dwell(params["tag"], params["suspect"])


async def make_suspects(store: Any, run_ids: list[str]) -> None:
    """Each of these queued runs crashed a worker once (its crash counted)."""
    for run_id in run_ids:
        assert await store.claim_run(run_id, "dead", now=time.time(), lock_ttl=30) is not None
    outcomes = await store.reclaim_worker("dead", now=time.time(), charge=run_ids,
                                          poison=PoisonPolicy(max_retries=100))
    assert sorted(o.run_id for o in outcomes) == sorted(run_ids)


async def test_a_suspect_runs_alone_and_ordinary_runs_run_together(store: Any) -> None:
    IN_CODE.update(now=set(), alone=[], beside=0, most=0)
    client = WorkflowClient(store)
    suspects = [await client.submit(dwelling, {"tag": f"s{i}", "suspect": True})
                for i in range(4)]
    ordinary = [await client.submit(dwelling, {"tag": f"o{i}", "suspect": False})
                for i in range(4)]
    await make_suspects(store, [r.run_id for r in suspects])
    worker = reporting_worker(store, [dwelling], max_concurrent_runs=8)
    WORKERS.append(worker)
    async with serving(worker):
        for i, run in enumerate(suspects):
            assert await worker.client.result(run.run_id, timeout=30) == f"s{i}"
        for i, run in enumerate(ordinary):
            assert await worker.client.result(run.run_id, timeout=30) == f"o{i}"
    by_id = {r.run_id for r in suspects}
    assert len(IN_CODE["alone"]) == 4
    for in_flight, in_code, reported_suspects, named in IN_CODE["alone"]:
        # The worker held the suspect only, and told its supervisor so.
        assert in_flight == 1
        assert len(in_code) == 1 and in_code <= by_id
        assert reported_suspects == in_code and named
    assert IN_CODE["beside"] > 1  # ordinary runs are not run one at a time
    for run in suspects:  # each started once more, by this worker, alone
        assert len(of_type(await client.events(run.run_id), "run:started")) == 2


RELEASE = {"held": False}


@step(name="wsusp_hold")
async def hold(tag: str) -> str:
    while not RELEASE["held"]:
        await asyncio.sleep(0.01)
    return tag


@workflow(name="wsusp_holding")
async def holding(ctx: WorkflowContext, params: Any) -> Any:
    return await hold(params["tag"])


async def test_a_suspect_stopped_at_shutdown_goes_back_uncharged_and_still_a_suspect(
    store: Any,
) -> None:
    RELEASE["held"] = False
    client = WorkflowClient(store)
    first, second = [await client.submit(holding, {"tag": t}) for t in ("first", "second")]
    ordinary = await client.submit(holding, {"tag": "ordinary"})
    await make_suspects(store, [first.run_id, second.run_id])
    worker = reporting_worker(store, [holding], shutdown_grace=0.1)
    reporter = REPORTER[-1]
    async with serving(worker):
        # The ordinary run is claimed first; the suspects wait until it has ended.
        await await_until(lambda: reporter.names(ordinary.run_id), what="the ordinary run")
        assert worker.in_flight == 1 and reporter.suspects == frozenset()
        RELEASE["held"] = True
        assert await worker.client.result(ordinary.run_id, timeout=30) == "ordinary"
        RELEASE["held"] = False
        await await_until(lambda: reporter.user_code & {first.run_id, second.run_id},
                          what="one suspect in its code")
        [running] = reporter.user_code & {first.run_id, second.run_id}
        assert reporter.suspects == {running}
        assert worker.in_flight == 1  # the other suspect is not claimed beside it
    RELEASE["held"] = True
    waited = next(r for r in (first, second) if r.run_id != running)
    for run in (first, second):
        info = await client.get(run.run_id)
        assert info.status is RunStatus.QUEUED
        journal = await client.events(run.run_id)
        reasons = [(e["reason"], e.get("crashes")) for e in of_type(journal, "run:requeued")]
        if run is waited:  # never claimed again
            assert reasons == [("orphaned", 1)]
            assert of_type(journal, "step:started") == []
        else:
            assert reasons == [("orphaned", 1), ("shutdown", None)]
    # Both still wait apart from the ordinary queue, each with its one crash.
    passed = await store.claim("next", ["wsusp_holding"], limit=10, now=time.time(),
                               lock_ttl=30)
    assert list(passed) == [] and passed.suspects
    taken = set()
    for _ in range(2):
        again = await store.claim_suspect("next", passed.suspects, now=time.time(), lock_ttl=30)
        assert again is not None and again.suspect and len(again.crashes) == 1
        taken.add(again.run_id)
    assert taken == {first.run_id, second.run_id}


async def test_a_worker_running_a_suspect_alone_is_not_taken_for_a_stalled_one(
    store: Any,
) -> None:
    # A fleet recycles a child with free slots whose claim loop made no progress for
    # --stall-timeout: one that waits on purpose, for a long suspect, still stamps it.
    RELEASE["held"] = False
    client = WorkflowClient(store)
    run = await client.submit(holding, {"tag": "long"})
    await make_suspects(store, [run.run_id])
    worker = reporting_worker(store, [holding], claim_poll_interval=0.05)
    reporter = REPORTER[-1]
    async with serving(worker):
        await await_until(lambda: reporter.names(run.run_id), what="the suspect in its code")
        began = time.monotonic()
        ages = []
        while time.monotonic() - began < 1.0:
            ages.append(worker.claim_tick_age())
            await asyncio.sleep(0.05)
        RELEASE["held"] = True
        assert await worker.client.result(run.run_id, timeout=30) == "long"
    assert max(ages) < 0.5, ages


async def test_a_suspect_cancelled_while_another_runs_ends_without_running(
    store: Any,
) -> None:
    RELEASE["held"] = False
    client = WorkflowClient(store)
    first, second = [await client.submit(holding, {"tag": t}) for t in ("first", "second")]
    await make_suspects(store, [first.run_id, second.run_id])
    worker = reporting_worker(store, [holding])
    async with serving(worker):
        reporter = REPORTER[-1]
        await await_until(lambda: reporter.user_code & {first.run_id, second.run_id},
                          what="one suspect in its code, the other waiting")
        assert worker.in_flight == 1
        [running] = reporter.user_code & {first.run_id, second.run_id}
        waiting = second if running == first.run_id else first
        assert await client.cancel(waiting.run_id)
        assert (await client.get(waiting.run_id)).status is RunStatus.CANCELLED
        RELEASE["held"] = True
        assert await worker.client.result(running, timeout=30) in ("first", "second")
    journal = await client.events(waiting.run_id)
    assert of_type(journal, "step:started") == []
    assert len(of_type(journal, "run:started")) == 1  # the attempt that crashed only


async def test_a_worker_busy_with_a_long_run_passes_suspects_over_and_keeps_claiming(
    store: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Waiting for its runs to end to take a suspect is bounded: a worker holding a long run
    # must not idle its free slots for it; after SUSPECT_DRAIN_S it claims as usual.
    from pyrula.workflows.worker import claim as claim_loop

    monkeypatch.setattr(claim_loop, "SUSPECT_DRAIN_S", 0.3)
    RELEASE["held"] = False
    client = WorkflowClient(store)
    long_run = await client.submit(holding, {"tag": "long"})
    worker = reporting_worker(store, [holding, dwelling], max_concurrent_runs=4)
    async with serving(worker):
        await await_until(lambda: worker.in_flight == 1, what="the long run held")
        # The serving worker may claim a run before the dead worker below does: that one
        # just runs (an ordinary run), and the next is tried until a crash is charged.
        for _ in range(50):
            suspect = await client.submit(dwelling, {"tag": "s", "suspect": False})
            if await store.claim_run(suspect.run_id, "dead", now=time.time(),
                                     lock_ttl=30) is not None:
                break
        else:
            pytest.fail("the serving worker claimed every run before the dead one could")
        charged = await store.reclaim_worker("dead", now=time.time(), charge=[suspect.run_id],
                                             poison=PoisonPolicy(max_retries=100))
        assert [o.run_id for o in charged] == [suspect.run_id]
        later = await client.submit(dwelling, {"tag": "later", "suspect": False})
        # Claimed beside the long run once the drain gave up, the suspect still waiting.
        assert await worker.client.result(later.run_id, timeout=20) == "later"
        assert (await client.get(suspect.run_id)).status is RunStatus.QUEUED
        RELEASE["held"] = True
        assert await worker.client.result(long_run.run_id, timeout=20) == "long"
        assert await worker.client.result(suspect.run_id, timeout=40) == "s"
