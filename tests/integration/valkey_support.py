"""Shared plumbing of the ValkeyStore integration tests (tests/integration/test_valkey_*.py).

Workflows here register under ``vk.*`` names; every test passes ``workflows=[...]`` so a
worker serves only what the test means it to. Steps record each execution in ``LEDGER``
(thread-safe, keyed by the run's tag), which is how tests count side effects: a step that
ran twice shows up twice there, whatever the journal says.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterable
from typing import Any

import redis

from pyrula.workflows import (
    RunStatus,
    ValkeyStore,
    WorkerOptions,
    WorkflowContext,
    WorkflowWorker,
    step,
    workflow,
)
from pyrula.workflows.projections import ProjectionSpec
from pyrula.workflows.schedules import Schedule
from pyrula.workflows.schedules.control import (
    apause_schedule,
    aresume_schedule,
    arun_schedule_now,
)
from pyrula.workflows.stores.valkey.keys import name_hash
from pyrula.workflows.worker.projections import fold_once
from tests.conftest import await_until


class Ledger:
    """Executions of steps, by (step, tag), from any thread; and concurrency gauges."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.runs: Counter[tuple[str, str]] = Counter()
        self.order: list[tuple[str, str]] = []
        self.active: Counter[str] = Counter()
        self.peak: Counter[str] = Counter()

    def record(self, step_name: str, tag: str) -> None:
        with self._lock:
            self.runs[(step_name, tag)] += 1
            self.order.append((step_name, tag))

    def count(self, step_name: str, tag: str) -> int:
        with self._lock:
            return self.runs[(step_name, tag)]

    def enter(self, group: str) -> None:
        with self._lock:
            self.active[group] += 1
            self.peak[group] = max(self.peak[group], self.active[group])

    def leave(self, group: str) -> None:
        with self._lock:
            self.active[group] -= 1

    def clear(self) -> None:
        with self._lock:
            self.runs.clear()
            self.order.clear()
            self.active.clear()
            self.peak.clear()


LEDGER = Ledger()


@step(name="vk.touch")
async def touch(tag: str) -> str:
    LEDGER.record("vk.touch", tag)
    return tag


@step(name="vk.touch_again")
async def touch_again(tag: str) -> str:
    LEDGER.record("vk.touch_again", tag)
    return tag + "!"


@workflow(name="vk.one_step")
async def one_step(ctx: WorkflowContext, params: dict[str, Any]) -> str:
    return str(await touch(params["tag"]))


def _count_ended(state: Any, run: Any) -> int:
    return int(state or 0) + 1


@workflow(name="vk.two_steps")
async def two_steps(ctx: WorkflowContext, params: dict[str, Any]) -> list[str]:
    first = await touch(params["tag"])
    second = await touch_again(params["tag"])
    return [first, second]


@workflow(name="vk.noop")
async def noop(ctx: WorkflowContext, params: dict[str, Any]) -> str:
    return str(params["tag"])


#: Gates "vk.hold" steps wait on, by name (see ``gate``); a step with no gate does not wait.
GATES: dict[str, threading.Event] = {}


def gate(name: str) -> threading.Event:
    return GATES.setdefault(name, threading.Event())


@step(name="vk.hold")
async def hold(tag: str, group: str, gate_name: str) -> str:
    """Counts itself in ``LEDGER.active[group]`` while it runs; returns once the gate named
    ``gate_name`` is open, or after a moment (the work a real step does) without a gate."""
    LEDGER.enter(group)
    try:
        LEDGER.record("vk.hold", tag)
        event = GATES.get(gate_name) if gate_name else None
        if event is None:
            await asyncio.sleep(0.01)  # the step's own work, not synchronisation
        else:
            while not event.is_set():
                await asyncio.sleep(0.01)
        return tag
    finally:
        LEDGER.leave(group)


@workflow(name="vk.held")
async def held(ctx: WorkflowContext, params: dict[str, Any]) -> str:
    return str(await hold(params["tag"], params.get("group", ""), params.get("gate", "")))


@workflow(name="vk.sleeps")
async def sleeps(ctx: WorkflowContext, params: dict[str, Any]) -> str:
    await touch(params["tag"])
    await ctx.sleep(params.get("seconds", 0.1))
    return str(await touch_again(params["tag"]))


@workflow(name="vk.awaits_signal")
async def awaits_signal(ctx: WorkflowContext, params: dict[str, Any]) -> Any:
    await touch(params["tag"])
    return await ctx.wait_for_signal("go")


FAST = {
    "claim_poll_interval": 0.02,
    "timer_poll_interval_s": 0.05,
    "orphan_scan_interval": 0.2,
    "shutdown_grace": 5.0,
    "cancel_timeout": 1.0,
    "lock_ttl": 2.0,
    "shard_lease_interval": 0.2,
    "shard_lease_ttl": 1.0,
}


def options(**overrides: Any) -> WorkerOptions:
    """Worker options tuned for tests: fast polls, short locks and leases."""
    return WorkerOptions(**{**FAST, **overrides})


@contextlib.asynccontextmanager
async def opened(*stores: ValkeyStore) -> AsyncIterator[None]:
    """Close the stores' clients afterwards: this loop's, and those of other loops (the
    synchronous facade's) that the body made them open."""
    try:
        yield
    finally:
        for store in stores:
            await store.aclose()
            store.close()


def make_worker(store: Any, workflows: Iterable[Any], **overrides: Any) -> WorkflowWorker:
    return WorkflowWorker(
        store=store, workflows=list(workflows), options=options(**overrides), cloud=False
    )


@contextlib.asynccontextmanager
async def serving(worker: WorkflowWorker, ready: bool = True) -> AsyncIterator[asyncio.Task[None]]:
    """Run ``worker.run()`` as a task for the body of the ``async with``; stop it after and
    re-raise whatever it raised. With ``ready`` the body starts once the worker is ready."""
    task = asyncio.create_task(worker.run())
    try:
        if ready:
            await await_until(
                lambda: worker.state == "ready" or task.done(), timeout=15,
                what="the worker to be ready",
            )
            if task.done():
                task.result()  # raise what run() raised
        yield task
    finally:
        worker.stop()
        await asyncio.wait_for(asyncio.shield(task), 30)
    task.result()


async def all_ended(store: Any, run_ids: Iterable[str], timeout: float = 20.0) -> None:
    ids = list(run_ids)

    async def check() -> bool:
        for run_id in ids:
            info = await store.get_run(run_id)
            if info is None or not info.status.terminal:
                return False
        return True

    await await_until(check, timeout=timeout, interval=0.05,
                      what=f"{len(ids)} runs to end")


async def statuses(store: Any, run_ids: Iterable[str]) -> Counter[RunStatus | None]:
    out: Counter[RunStatus | None] = Counter()
    for run_id in run_ids:
        info = await store.get_run(run_id)
        out[None if info is None else info.status] += 1
    return out


def keys_on_shards(shards: Iterable[int], shard_count: int, prefix: str = "key") -> list[str]:
    """Idempotency keys that put a run on each of ``shards`` (the key picks the shard)."""
    wanted = list(shards)
    found: dict[int, str] = {}
    i = 0
    while len(found) < len(set(wanted)):
        key = f"{prefix}-{i}"
        shard = int(name_hash(key), 16) % shard_count
        if shard in wanted:
            found.setdefault(shard, key)
        i += 1
    return [found[s] for s in wanted]


def all_keys(url: str, match: str = "*") -> list[str]:
    with redis.Redis.from_url(url, decode_responses=True) as client:
        return sorted(client.scan_iter(match=match, count=1000))


async def exercise(store: ValkeyStore, worker: WorkflowWorker, tag: str = "") -> None:
    """Every kind of call the store makes (runs of a priority among them), through a worker
    serving ``two_steps``, ``sleeps`` and ``awaits_signal``, and its client. ``tag`` keeps
    ledger entries apart.
    With the worker's ``schedule_interval`` under 5 s its schedule loop fires a schedule
    too (otherwise the schedule runs only through ``run_schedule_now``)."""
    client = worker.client
    await store.aflow_control_set("metered", max_concurrent=2, max_starts_per_second=50.0)
    assert (await store.aflow_control_get("metered")) is not None
    handles = [
        await client.submit(two_steps, {"tag": f"{tag}a{i}"},
                            owner="metered" if i % 2 else None, idempotency_key=f"k{i}",
                            priority=3 if i in (2, 3) else 0)
        for i in range(6)
    ]
    again = await client.submit(two_steps, {"tag": f"{tag}a0"}, idempotency_key="k0")
    assert again.run_id == handles[0].run_id
    sleeper = await client.submit(sleeps, {"tag": f"{tag}s", "seconds": 0.05})
    waiter = await client.submit(awaits_signal, {"tag": f"{tag}w"})
    stranded = await client.submit("vk.nobody_serves_this", {})
    assert await client.cancel(stranded.run_id)
    urgent = await client.submit("vk.nobody_serves_this", {}, priority=7)
    assert await client.cancel(urgent.run_id)  # a queued run of a priority leaves its list

    async def waiting() -> bool:
        return (await client.get(waiter.run_id)).status is RunStatus.WAITING

    await await_until(waiting, what="the run to wait for its signal")
    await client.signal(waiter.run_id, "go", 42)

    for i, handle in enumerate(handles):
        assert await client.result(handle.run_id, timeout=15) == [f"{tag}a{i}", f"{tag}a{i}!"]
    assert await client.result(sleeper.run_id, timeout=15) == f"{tag}s!"
    assert await client.result(waiter.run_id, timeout=15) == 42
    assert (await client.get(stranded.run_id)).status is RunStatus.CANCELLED

    # Two owners queued on one shard, claimed in one batch: deficit round robin in the
    # claim (a name the worker does not serve, so this claim is the only one).
    unserved = "vk.nobody_serves_this"
    keys = [keys_on_shards([7], store.shard_count, prefix=f"{tag}pair{i}")[0] for i in range(4)]
    queued = [(await client.submit(unserved, {}, owner=owner, idempotency_key=key)).run_id
              for owner, key in zip(("x", "x", "x", "y"), keys, strict=True)]
    now = time.time()
    claimed = await store.claim("exercise", [unserved], limit=3, now=now, lock_ttl=30)
    assert [c.run_id for c in claimed] == [queued[0], queued[3], queued[1]]
    for run in claimed:
        await store.finish(run.run_id, run.token, [], now=now, status=RunStatus.COMPLETED)
    assert await client.cancel(queued[2])

    journal = await client.events(handles[0].run_id)
    assert journal[-1]["type"] == "run:completed"
    assert await client.events(handles[0].run_id, after_seq=len(journal)) == []
    listed = [info async for info in client.list_runs(name="vk.two_steps", limit=3)]
    assert len(listed) == 3
    assert await store.aflow_control_delete("metered")

    # Events: emitted (a key repeated), each taken into a batch run of its own by the
    # store's take (twice: the second pass prunes the copied log); the runs are cancelled.
    topic = f"{tag}vk.topic"
    first = await client.emit(topic, {"n": 1}, key="e1")
    assert await client.emit(topic, {"n": 1}, key="e1") == first
    await client.emit(topic, {"n": 2}, owner="metered")
    batches = []
    for _ in range(2):
        batches += await store.take_batches("vk.batch", topic, max_size=1, max_wait=60.0,
                                            now=time.time(), limit=10)
    assert len(batches) == 2
    for batch in batches:
        assert await client.cancel(batch.run_id)

    # Projections: the ended runs folded (a save, and a second pass finding nothing new),
    # read whole and listed, then rebuilt.
    spec = ProjectionSpec(f"{tag}vk.ended", ("vk.two_steps", "vk.batch"), _count_ended)
    done = await fold_once(store, spec, now=time.time() + 60, grace=0.0)
    assert done.outcome == "saved" and done.folded >= 3, done
    assert (await fold_once(store, spec, now=time.time() + 60, grace=0.0)).outcome == "idle"
    assert await client.projection(spec.name) == done.folded
    assert spec.name in [p.name for p in await client.projections()]
    await client.rebuild_projection(spec.name)

    # Schedules: created (due a second later), fired by the worker's loop when its
    # schedule_interval is short, listed, paused and resumed, run now. The loop's firing
    # is awaited before the pause: a resume starts from the first occurrence after it, a
    # minute away, so a slow machine reaching the resume late would miss the due one.
    sched = Schedule.create(two_steps, every=60, params={"tag": f"{tag}sched"},
                            schedule_id=f"{tag}every-minute", created_at=time.time() - 59)
    await store.aschedule_create(sched)
    if worker.options.schedule_interval < 5:

        async def fired() -> bool:
            got = await store.aschedule_get(sched.schedule_id)
            return got is not None and got.last_run_id is not None

        await await_until(fired, timeout=20, what="the schedule loop to fire the schedule")
    assert [s.schedule_id for s in await store.aschedule_list()] == [sched.schedule_id]
    await apause_schedule(store, sched.schedule_id)
    await aresume_schedule(store, sched.schedule_id)
    now_run = await arun_schedule_now(store, sched.schedule_id)
    assert await client.result(now_run.run_id, timeout=15) == [f"{tag}sched", f"{tag}sched!"]
    got = await store.aschedule_get(sched.schedule_id)
    assert got is not None and got.last_run_id == now_run.run_id
    assert await store.aschedule_delete(sched.schedule_id)
    store.ping()


class LogCapture(logging.Handler):
    """Records of the ``pyrula`` loggers with their ``event`` field, for asserting on logs."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self._records_lock = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        with self._records_lock:
            self.records.append(record)

    def events(self, name: str | None = None) -> list[logging.LogRecord]:
        with self._records_lock:
            records = list(self.records)
        return [r for r in records if name is None or getattr(r, "event", None) == name]

    def messages(self) -> list[str]:
        with self._records_lock:
            return [r.getMessage() for r in self.records]


@contextlib.contextmanager
def captured_logs(logger_name: str = "pyrula") -> Any:
    handler = LogCapture()
    log = logging.getLogger(logger_name)
    old_level = log.level
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        log.removeHandler(handler)
        log.setLevel(old_level)
