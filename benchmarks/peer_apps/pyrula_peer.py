"""pyrula in the peer comparison: the ``pyrula.bench`` workflow (``steps`` journaled
``x + 1`` steps) on the Valkey store, served by a real ``pyrula-fleet start -n 2``."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar

from benchmarks.peer_apps.harness import (
    RESULT_TIMEOUT,
    Clock,
    RedisServer,
    Service,
    atimed_round_trips,
    check_value,
    start_python,
    sync_throughput,
    timed_round_trips,
)
from pyrula.workflows import SyncWorkflowClient, ValkeyStore, WorkflowClient

WORKFLOW = "pyrula.bench"
APP = "pyrula.examples.bench"
FLEET_CHILDREN = 2
#: Runs submitted (and results read) per asyncio.gather in the async bulk variant.
BATCH = 200
T = TypeVar("T")


class PyrulaPeer:
    name = "pyrula"
    scenarios: tuple[str, ...] = ("1-step", "5-step", "latency", "async-bulk")

    def __init__(self, server: RedisServer, logs: Path, warmup: int, *,
                 step_kind: str = "sync", log_level: str | None = None) -> None:
        self.server = server
        self.logs = logs
        self.warmup = warmup
        #: ``"sync"``: ``def`` steps, as the README writes them (the path users take);
        #: ``"async"``: ``async def`` steps on the worker's loop (the best case).
        self.step_kind = step_kind
        #: The fleet's ``--log-level`` (None: its default, INFO, as users run it).
        self.log_level = log_level

    def _params(self, x: int, steps: int) -> dict[str, Any]:
        return {"x": x, "steps": steps, "kind": self.step_kind}

    def run(self, scenario: str, runs: int) -> dict[str, float]:
        if scenario == "latency":
            return self.latency(runs)
        if scenario == "async-bulk":
            return asyncio.run(self.async_bulk(runs))
        return self.throughput(runs, 5 if scenario == "5-step" else 1)

    # --- processes ---------------------------------------------------------------------

    def _spawn_fleet(self, namespace: str) -> Service:
        return start_python("pyrula-fleet", [
            "-c", "from pyrula.cli.fleet import main; main()", "start",
            "-n", str(FLEET_CHILDREN), "--app", APP, "--store", self.server.url,
            "--namespace", namespace, "--health-port", "0",
            *(["--log-level", self.log_level] if self.log_level else []),
        ], self.server.url, self.logs)

    @staticmethod
    def _stop(fleet: Service) -> None:
        fleet.stop()  # SIGTERM to the supervisor: it drains and stops its children

    def _store(self) -> tuple[str, ValkeyStore]:
        namespace = f"peers{os.urandom(4).hex()}"
        return namespace, ValkeyStore(url=self.server.url, namespace=namespace)

    # --- scenarios ---------------------------------------------------------------------

    def throughput(self, runs: int, steps: int) -> dict[str, float]:
        namespace, store = self._store()
        client = SyncWorkflowClient(store)
        try:
            return sync_throughput(
                self.server, self.name, runs, steps,
                submit=lambda i: client.submit(WORKFLOW, self._params(i, steps)).run_id,
                spawn=lambda: self._spawn_fleet(namespace),
                wait=lambda run_id: client.result(run_id, timeout=RESULT_TIMEOUT),
                stop=self._stop,
            )
        finally:
            store.close()

    def _round_trip(self, client: SyncWorkflowClient, i: int) -> Any:
        run_id = client.submit(WORKFLOW, self._params(i, 1)).run_id
        return client.result(run_id, timeout=RESULT_TIMEOUT)

    def latency(self, samples: int) -> dict[str, float]:
        """The sync client's round trips, then the async client's, on one warm fleet."""
        self.server.reset()
        namespace, store = self._store()
        client = SyncWorkflowClient(store)
        fleet = self._spawn_fleet(namespace)
        try:
            figures = timed_round_trips(self.name, samples, self.warmup,
                                        lambda i: self._round_trip(client, i))
            async_figures = asyncio.run(self._async_latency(namespace, samples))
            figures.update({f"async_{k}": v for k, v in async_figures.items()})
            fleet.check()
        finally:
            self._stop(fleet)
            store.close()
        return figures

    async def _async_latency(self, namespace: str, samples: int) -> dict[str, float]:
        store = ValkeyStore(url=self.server.url, namespace=namespace)
        client = WorkflowClient(store)

        async def round_trip(i: int) -> Any:
            handle = await client.submit(WORKFLOW, self._params(i, 1))
            return await client.result(handle.run_id, timeout=RESULT_TIMEOUT)

        try:
            return await atimed_round_trips(self.name, samples, self.warmup, round_trip)
        finally:
            await store.aclose()

    async def async_bulk(self, runs: int) -> dict[str, float]:
        """The 1-step workload from an async client: submits and result reads gathered in
        batches of ``BATCH``."""
        self.server.reset()
        namespace, store = self._store()
        client = WorkflowClient(store)
        clock = Clock()
        try:
            clock.submit_start = clock.now()
            ids: list[str] = []
            for start in range(0, runs, BATCH):
                handles = await asyncio.gather(*(
                    client.submit(WORKFLOW, self._params(i, 1))
                    for i in range(start, min(runs, start + BATCH))))
                ids.extend(h.run_id for h in handles)
            clock.submit_end = clock.spawn = clock.now()
            fleet = self._spawn_fleet(namespace)
            try:
                done: list[float] = []
                for start in range(0, runs, BATCH):
                    batch = ids[start:start + BATCH]
                    values = await asyncio.gather(*(
                        _timed(client.result(run_id, timeout=RESULT_TIMEOUT), done)
                        for run_id in batch))
                    for offset, value in enumerate(values):
                        check_value(self.name, start + offset, value, start + offset + 1)
                clock.first, clock.last = min(done), max(done)
                usage = self.server.usage()
                fleet.check()
            finally:
                self._stop(fleet)
        finally:
            await store.aclose()
        return clock.figures(runs, usage)


async def _timed(awaitable: Awaitable[T], done: list[float]) -> T:
    """Await, and note when it finished (the first and last results of a gathered read)."""
    value = await awaitable
    done.append(time.perf_counter())
    return value
