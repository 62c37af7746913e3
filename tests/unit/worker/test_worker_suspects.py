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
    MemoryStore,
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
from tests.unit.worker.worker_support import (
    Bell,
    Spy,
    capture,
    claim_cut,
    fast_options,
    of_type,
    serving,
    start,
)


class Reporter:
    """Sends the worker's reports (claims, entries, heartbeats) and keeps the last one."""

    def __init__(self) -> None:
        self.worker: WorkflowWorker | None = None
        self.user_code: frozenset[str] = frozenset()
        self.suspects: frozenset[str] = frozenset()
        #: What each claim told: the held runs, run id -> attempt.
        self.held: list[dict[str, int]] = []
        self.lock = threading.Lock()

    def claimed(self, held: dict[str, int]) -> None:
        self.held.append(dict(held))
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
    # Each claim told the supervisor of the runs held then: every run, by its id.
    told: set[str] = set()
    for held in REPORTER[-1].held:
        told.update(held)
    assert told == {run.run_id for run in runs}


@workflow(name="wsusp_steps")
async def steps(ctx: WorkflowContext, params: Any) -> Any:
    first = await sync_part("a")
    await ctx.sleep(0.3)  # parks: long enough that a slow machine does not pass it first
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
    for run in suspects:  # each started once more, by this worker, alone, on its build
        started = of_type(await client.events(run.run_id), "run:started")
        assert len(started) == 2 and started[-1]["build"] == worker.build


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
    # must not idle its free slots for it; after SUSPECT_DRAIN_S it claims as usual, and
    # passes suspects over for SUSPECT_PASS_S (30 s) before it drains for them again.
    from pyrula.workflows.worker import claim as claim_loop

    monkeypatch.setattr(claim_loop, "SUSPECT_DRAIN_S", 0.3)
    RELEASE["held"] = False
    client = WorkflowClient(store)
    long_run = await client.submit(holding, {"tag": "long"})
    worker = reporting_worker(store, [holding, dwelling], max_concurrent_runs=4)
    claims = Spy(store, "claim")
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
        await await_until(lambda: any(c.suspects for _, _, c in claims.of("claim")),
                          what="a claim that saw the suspect")
        later = await client.submit(dwelling, {"tag": "later", "suspect": False})
        # Claimed beside the long run once the drain gave up, the suspect still waiting.
        assert await worker.client.result(later.run_id, timeout=20) == "later"
        assert (await client.get(suspect.run_id)).status is RunStatus.QUEUED
        # Passed over: a drain would now last longer than this test, and none begins.
        monkeypatch.setattr(claim_loop, "SUSPECT_DRAIN_S", 60.0)
        again = await client.submit(dwelling, {"tag": "again", "suspect": False})
        assert await worker.client.result(again.run_id, timeout=10) == "again"
        RELEASE["held"] = True
        assert await worker.client.result(long_run.run_id, timeout=20) == "long"
        # Still passed over (until SUSPECT_PASS_S is out), though nothing is held now.
        assert (await client.get(suspect.run_id)).status is RunStatus.QUEUED


async def test_no_run_is_claimed_beside_a_suspect_however_long_it_runs(
    store: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The bound on draining for a suspect to take does not bound running one alone.
    from pyrula.workflows.worker import claim as claim_loop

    monkeypatch.setattr(claim_loop, "SUSPECT_DRAIN_S", 0.05)
    RELEASE["held"] = False
    client = WorkflowClient(store)
    suspect = await client.submit(holding, {"tag": "s"})
    await make_suspects(store, [suspect.run_id])
    worker = reporting_worker(store, [holding, dwelling], max_concurrent_runs=4)
    reporter = REPORTER[-1]
    async with serving(worker):
        await await_until(lambda: reporter.names(suspect.run_id), what="the suspect in its code")
        ordinary = await client.submit(dwelling, {"tag": "o", "suspect": False})
        # Watched over many claim polls (10 ms) and drain bounds: the ordinary run waits.
        began = time.monotonic()
        while time.monotonic() - began < 0.5:
            assert worker.in_flight == 1
            assert (await client.get(ordinary.run_id)).status is RunStatus.QUEUED
            await asyncio.sleep(0.02)
        RELEASE["held"] = True
        assert await worker.client.result(suspect.run_id, timeout=20) == "s"
        assert await worker.client.result(ordinary.run_id, timeout=20) == "o"


class HandClock:
    """``time`` as the claim loop reads it (``time.monotonic()``), moved by the test only."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


async def capped_suspect(store: Any) -> Any:
    """A suspect no worker may claim: its owner's one allowed run is running elsewhere."""
    client = WorkflowClient(store)
    elsewhere = await client.submit(holding, {"tag": "elsewhere"}, owner="capped")
    suspect = await client.submit(holding, {"tag": "s"}, owner="capped")
    await make_suspects(store, [suspect.run_id])
    assert await store.claim_run(elsewhere.run_id, "elsewhere", now=time.time(),
                                 lock_ttl=600) is not None
    await store.aflow_control_set("capped", max_concurrent=1)
    return suspect


async def test_a_suspect_that_flow_control_holds_back_does_not_hold_the_worker_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Its owner may start no run now, so no worker can claim it: the worker that found
    # it passes suspects over (for its poll interval, at least a second: 30 s here) and
    # claims the others as usual, its long runs beside the rest.
    from pyrula.workflows.worker import claim as claim_loop

    monkeypatch.setattr(claim_loop, "SUSPECT_DRAIN_S", 60.0)  # a drain outlasts the test
    RELEASE["held"] = False
    store = MemoryStore()
    Bell(store)  # claims as soon as a run is submitted, not after the 30 s poll
    client = WorkflowClient(store)
    suspect = await capped_suspect(store)
    tries = Spy(store, "claim_suspect")
    worker = reporting_worker(store, [holding, dwelling], claim_poll_interval=30.0)
    async with serving(worker):
        await await_until(lambda: tries.of("claim_suspect"), what="a suspect claim")
        assert [taken for _, _, taken in tries.of("claim_suspect")] == [None]
        long_run = await client.submit(holding, {"tag": "long"})
        await await_until(lambda: worker.in_flight == 1, what="the long run held")
        later = await client.submit(dwelling, {"tag": "later", "suspect": False})
        assert await worker.client.result(later.run_id, timeout=10) == "later"
        RELEASE["held"] = True
        assert await worker.client.result(long_run.run_id, timeout=10) == "long"
    assert (await client.get(suspect.run_id)).status is RunStatus.QUEUED


GATES: dict[str, asyncio.Event] = {}


@step(name="wsusp_gate")
async def gate(tag: str) -> str:
    await GATES[tag].wait()
    return tag


@workflow(name="wsusp_gated")
async def gated(ctx: WorkflowContext, params: Any) -> Any:
    return await gate(params["tag"])


async def test_after_a_suspect_runs_run_together_again_and_the_next_suspect_waits(
    store: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Once a suspect's attempt has ended the worker claims beside its held runs again,
    # and a suspect seen later waits for the runs held then (a drain of a minute here).
    from pyrula.workflows.worker import claim as claim_loop

    monkeypatch.setattr(claim_loop, "SUSPECT_DRAIN_S", 60.0)
    RELEASE["held"] = True
    GATES["blocker"] = asyncio.Event()
    client = WorkflowClient(store)
    first = await client.submit(holding, {"tag": "first"})
    await make_suspects(store, [first.run_id])
    worker = reporting_worker(store, [holding, dwelling, gated], max_concurrent_runs=2)
    claims = Spy(store, "claim")
    async with serving(worker):
        assert await worker.client.result(first.run_id, timeout=20) == "first"
        RELEASE["held"] = False
        long_run = await client.submit(holding, {"tag": "long"})
        await await_until(lambda: worker.in_flight == 1, what="the long run held")
        beside = await client.submit(dwelling, {"tag": "beside", "suspect": False})
        assert await worker.client.result(beside.run_id, timeout=10) == "beside"
        # Both slots taken, so that the next suspect is made one before any claim sees it.
        blocker = await client.submit(gated, {"tag": "blocker"})
        await await_until(lambda: worker.in_flight == 2, what="both slots taken")
        second = await client.submit(dwelling, {"tag": "second", "suspect": False})
        await make_suspects(store, [second.run_id])
        seen = len(claims.of("claim"))
        GATES["blocker"].set()
        assert await worker.client.result(blocker.run_id, timeout=10) == "blocker"
        await await_until(lambda: any(c.suspects for _, _, c in claims.of("claim")[seen:]),
                          what="a claim that saw the second suspect")
        assert (await client.get(second.run_id)).status is RunStatus.QUEUED
        RELEASE["held"] = True
        assert await worker.client.result(long_run.run_id, timeout=10) == "long"
        assert await worker.client.result(second.run_id, timeout=10) == "second"


async def test_a_suspect_is_claimed_as_soon_as_the_held_runs_end() -> None:
    # The drain ends when the last held run does, not at the next claim poll (30 s here).
    RELEASE["held"] = False
    store = MemoryStore()
    Bell(store)  # claims as soon as a run is submitted, not after the 30 s poll
    client = WorkflowClient(store)
    worker = reporting_worker(store, [holding, dwelling], claim_poll_interval=30.0)
    WORKERS.append(worker)
    claims = Spy(store, "claim")
    async with serving(worker):
        long_run = await client.submit(holding, {"tag": "long"})
        await await_until(lambda: worker.in_flight == 1, what="the long run held")
        suspect = await client.submit(dwelling, {"tag": "s", "suspect": True})
        await make_suspects(store, [suspect.run_id])
        await await_until(lambda: any(c.suspects for _, _, c in claims.of("claim")),
                          what="a claim that saw the suspect")
        RELEASE["held"] = True
        assert await worker.client.result(long_run.run_id, timeout=10) == "long"
        assert await worker.client.result(suspect.run_id, timeout=10) == "s"


async def test_a_worker_stopped_while_it_waits_to_take_a_suspect_stops_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Its wait for the held runs to end watches the stop too: the claim loop ends at once,
    # not at the next poll (30 s here), nor when the shutdown gives up on it (after the
    # grace); the held run is then put back as at any shutdown.
    capture(caplog)
    RELEASE["held"] = False
    store = MemoryStore()
    Bell(store)
    client = WorkflowClient(store)
    worker = reporting_worker(store, [holding, dwelling], claim_poll_interval=30.0,
                              shutdown_grace=0.1)
    claims = Spy(store, "claim")
    task = await start(worker)
    try:
        long_run = await client.submit(holding, {"tag": "long"})
        await await_until(lambda: worker.in_flight == 1, what="the long run held")
        suspect = await client.submit(dwelling, {"tag": "s", "suspect": False})
        await make_suspects(store, [suspect.run_id])
        await await_until(lambda: any(c.suspects for _, _, c in claims.of("claim")),
                          what="a claim that saw the suspect")
        worker.stop()
        await asyncio.wait_for(task, 20)
    finally:
        RELEASE["held"] = True
    assert not claim_cut(caplog)
    for run in (long_run, suspect):
        assert (await client.get(run.run_id)).status is RunStatus.QUEUED


async def test_a_suspect_claim_that_finds_none_passes_suspects_over_for_a_second(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # By the claim loop's clock (moved by hand): after a suspect claim found none to take,
    # its claims pass suspects over for max(1 s, claim_poll_interval), then look again.
    from pyrula.workflows.worker import claim as claim_loop

    clock = HandClock()
    monkeypatch.setattr(claim_loop, "time", clock)
    store = MemoryStore()
    await capped_suspect(store)
    spy = Spy(store, "claim", "claim_suspect")
    worker = reporting_worker(store, [holding], claim_poll_interval=0.01)
    async with serving(worker):
        await await_until(lambda: spy.count("claim_suspect") == 1, what="a suspect claim")
        clock.now += 0.5
        claims = spy.count("claim")
        await await_until(lambda: spy.count("claim") >= claims + 3, what="three more claims")
        assert spy.count("claim_suspect") == 1  # passed over
        clock.now += 0.5  # a second on
        await await_until(lambda: spy.count("claim_suspect") == 2, what="suspects looked at")
    assert [taken for _, _, taken in spy.of("claim_suspect")] == [None, None]


async def test_with_no_time_to_wait_for_its_runs_a_worker_claims_beside_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # SUSPECT_DRAIN_S bounds the wait for the held runs to end to take a suspect; at 0 (and
    # the claim loop's clock standing still) there is no wait at all.
    from pyrula.workflows.worker import claim as claim_loop

    monkeypatch.setattr(claim_loop, "time", HandClock())
    monkeypatch.setattr(claim_loop, "SUSPECT_DRAIN_S", 0.0)
    RELEASE["held"] = False
    store = MemoryStore()
    client = WorkflowClient(store)
    worker = reporting_worker(store, [holding, dwelling], max_concurrent_runs=4)
    claims = Spy(store, "claim")
    async with serving(worker):
        long_run = await client.submit(holding, {"tag": "long"})
        await await_until(lambda: worker.in_flight == 1, what="the long run held")
        suspect = await client.submit(dwelling, {"tag": "s", "suspect": False})
        await make_suspects(store, [suspect.run_id])
        await await_until(lambda: any(c.suspects for _, _, c in claims.of("claim")),
                          what="a claim that saw the suspect")
        later = await client.submit(dwelling, {"tag": "later", "suspect": False})
        assert await worker.client.result(later.run_id, timeout=10) == "later"
        assert (await client.get(suspect.run_id)).status is RunStatus.QUEUED
        RELEASE["held"] = True
        assert await worker.client.result(long_run.run_id, timeout=10) == "long"
