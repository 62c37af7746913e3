"""A store, a client and in-process workers on an event loop of their own, driven from sync
code (a Hypothesis state machine's rules), and the checks a quiescent system must pass.

The loop runs on a background thread, so workers keep turning (heartbeats, lock renewal,
timers) between two rules while Hypothesis draws the next one. Time is a ``ManualClock``
the test advances: a nap's timer falls due only when the test says time passed.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Coroutine, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

from pyrula.workflows import RunInfo, RunStatus, WorkflowClient, WorkflowContext, WorkflowWorker
from pyrula.workflows.clock import ManualClock
from pyrula.workflows.definition import Registry, WorkflowSpec
from pyrula.workflows.events import TERMINAL_EVENTS
from tests.conftest import wait_until
from tests.generative.model import Kind, Model
from tests.unit.worker.worker_support import fast_options

T = TypeVar("T")

#: Seconds a quiescent state may take to show (every run where the model says it is).
BOUND = 20.0

#: The options of every worker: no orphan scans after the first (the manual clock would
#: make every lock look lapsed after a jump), shard leases that outlive any jump, a short
#: grace so a stop with a run in flight cuts it off quickly, small polling intervals.
OPTIONS = fast_options(
    lock_ttl=1.0, shutdown_grace=0.3, cancel_timeout=1.0, orphan_scan_interval=100_000.0,
    shard_lease_interval=0.05, shard_lease_ttl=1_000_000.0, timer_poll_interval_s=0.02,
)


@dataclass
class LiveWorker:
    worker: WorkflowWorker
    task: Future[None]
    names: tuple[str, ...]
    #: The store object it was given: the harness's, or one of its own on the same store.
    store: Any


def other_store(store: Any) -> Any:
    """Another store object on the same store (as another process opens it), where the
    backend has one; the memory store is one object."""
    from pyrula.workflows import SQLiteStore, ValkeyStore

    if isinstance(store, ValkeyStore):
        conn = store.connection
        return ValkeyStore(url=conn.url, namespace=conn.namespace, shard_count=conn.shard_count)
    if isinstance(store, SQLiteStore):
        return SQLiteStore(store.path)
    return store


class Harness:
    """One store under test, with the workflows of ``kinds``; close it with ``close``."""

    def __init__(self, store: Any, kinds: Sequence[Kind]) -> None:
        self.kinds = {k.name: k for k in kinds}
        self.clock = ManualClock()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True,
                                        name="harness-loop")
        self._thread.start()
        self.store = store
        self.client = WorkflowClient(store, clock=self.clock)
        self.registry = self._registry()
        self.workers: list[LiveWorker] = []
        self._releases: dict[str, asyncio.Event] = {}
        #: ``client.result`` calls left waiting, by run id, through a store object of their
        #: own (a caller in another process learns of the end from the store).
        self.waiters: dict[str, Future[Any]] = {}
        self._reader: Any = None

    # --- plumbing ----------------------------------------------------------------------

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        """Run ``coro`` on the harness loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def _registry(self) -> Registry:
        registry = Registry()
        for kind in self.kinds.values():
            registry.add_workflow(WorkflowSpec(name=kind.name, fn=self._workflow(kind)))
        return registry

    def _workflow(self, kind: Kind) -> Any:
        if kind.behaviour == "echo":
            async def echo(ctx: WorkflowContext, params: Any) -> Any:
                return {"params": params}
            return echo
        if kind.behaviour == "gate":
            async def gate(ctx: WorkflowContext, params: Any) -> Any:
                return {"signal": await ctx.wait_for_signal(kind.signal, kind.timeout)}
            return gate
        if kind.behaviour == "ask":
            async def ask(ctx: WorkflowContext, params: Any) -> Any:
                return {"signal": await ctx.interrupt(params)}
            return ask
        if kind.behaviour == "nap":
            async def nap(ctx: WorkflowContext, params: Any) -> Any:
                await ctx.sleep(params["seconds"])
                return {"slept": params["seconds"]}
            return nap

        async def hold(ctx: WorkflowContext, params: Any) -> Any:
            await self._release(params["key"]).wait()
            return {"released": params["key"]}
        return hold

    def _release(self, key: str) -> asyncio.Event:
        """The event a hold run of ``key`` waits for (on the harness loop)."""
        return self._releases.setdefault(key, asyncio.Event())

    def release(self, key: str) -> None:
        async def set_it() -> None:
            self._release(key).set()
        self.call(set_it())

    # --- workers -----------------------------------------------------------------------

    def start_worker(self, names: Sequence[str], separate: bool = False) -> LiveWorker:
        """A worker serving ``names`` (in that order), through a store object of its own if
        ``separate``; returned once it serves."""
        store = other_store(self.store) if separate else self.store
        worker = WorkflowWorker(store=store, workflows=list(names), registry=self.registry,
                                options=OPTIONS, cloud=False, clock=self.clock)
        task = asyncio.run_coroutine_threadsafe(worker.run(), self.loop)
        wait_until(lambda: worker.state != "starting" or task.done(), timeout=BOUND,
                   interval=0.01, what=f"a worker serving {names} to start")
        if task.done():
            task.result()
        live = LiveWorker(worker, task, tuple(names), store)
        self.workers.append(live)
        return live

    def stop_worker(self, live: LiveWorker) -> None:
        async def stop() -> None:
            live.worker.stop()
        self.call(stop())
        live.task.result(30)
        self.workers.remove(live)
        if live.store is not self.store:
            self.call(live.store.aclose())

    @property
    def served(self) -> set[str]:
        return {name for live in self.workers for name in live.names}

    def held(self) -> list[dict[str, int]]:
        """Each live worker's held runs, read on the loop (one consistent snapshot)."""
        async def read() -> list[dict[str, int]]:
            return [live.worker.held_runs() for live in self.workers]
        return self.call(read())

    def wait_result(self, run_id: str) -> None:
        """Leave a ``client.result(run_id)`` waiting (on a reader's store object)."""
        if self._reader is None:
            self._reader = other_store(self.store)
        client = WorkflowClient(self._reader, clock=self.clock)
        self.waiters.setdefault(
            run_id, asyncio.run_coroutine_threadsafe(client.result(run_id), self.loop))

    def close(self) -> None:
        try:
            for live in list(self.workers):
                self.stop_worker(live)
            for waiter in self.waiters.values():
                waiter.cancel()
            if self._reader is not None and self._reader is not self.store:
                self.call(self._reader.aclose())
            self.call(self.store.aclose())
        finally:
            self.call(_cancel_the_rest())
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(30)
            self.loop.close()

    # --- checks ------------------------------------------------------------------------

    def infos(self, run_ids: Sequence[str]) -> dict[str, RunInfo]:
        async def read() -> dict[str, RunInfo]:
            return {run_id: await self.client.get(run_id) for run_id in run_ids}
        return self.call(read())

    def events(self, run_ids: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
        async def read() -> dict[str, list[dict[str, Any]]]:
            return {run_id: list(await self.client.events(run_id)) for run_id in run_ids}
        return self.call(read())

    def list_runs(self, **filters: Any) -> list[str]:
        async def read() -> list[str]:
            return [info.run_id async for info in self.client.list_runs(**filters)]
        return self.call(read())

    def quiesce(self, model: Model) -> dict[str, RunInfo]:
        """Wait until the store shows every run as the model expects (within ``BOUND``);
        the infos read last. Fails naming each run that differs."""
        served = self.served
        model.settle(served, any_worker=bool(self.workers))
        expected = {rid: (model.expected(run, served), run) for rid, run in model.runs.items()}
        deadline = time.monotonic() + BOUND
        while True:
            infos = self.infos(list(expected))
            wrong = [
                (rid, run.kind, info.status.value, status.value)
                for rid, (status, run) in expected.items()
                if (info := infos[rid]).status != status
                or (status == RunStatus.COMPLETED and info.result != run.result)
            ]
            if not wrong:
                return infos
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"not quiescent within {BOUND} s (serving {sorted(served)}): "
                    + "; ".join(f"{rid} {kind} is {got}, expected {want}"
                                for rid, kind, got, want in wrong))
            time.sleep(0.02)


async def _cancel_the_rest() -> None:
    """Cancel the loop's other tasks and wait for them, as ``asyncio.run`` does at its end
    (the waiters left on ``client.result``, a store's watch of run ends)."""
    others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in others:
        task.cancel()
    await asyncio.gather(*others, return_exceptions=True)


def check_journal(run_id: str, events: list[dict[str, Any]], status: RunStatus) -> None:
    """No event lost or duplicated: seq 1..n, one run:submitted first, and a terminal event
    last and once exactly when the run has ended."""
    seqs = [e["seq"] for e in events]
    assert seqs == list(range(1, len(events) + 1)), f"{run_id}: seqs {seqs}"
    types = [e["type"] for e in events]
    assert types[:1] == ["run:submitted"], f"{run_id}: {types}"
    assert types.count("run:submitted") == 1, f"{run_id}: {types}"
    terminal = [t for t in types if t in TERMINAL_EVENTS]
    if status.terminal:
        assert terminal == [types[-1]], f"{run_id} ({status.value}): {types}"
    else:
        assert not terminal, f"{run_id} ({status.value}): {types}"
