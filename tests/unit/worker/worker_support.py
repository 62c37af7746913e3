"""Helpers shared by the in-process WorkflowWorker tests (tests/unit/test_worker_*.py).

Test doubles here replace one store method on one store instance (a spy that records
calls, an outage switch); everything else is the real store and the real worker.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest

from pyrula.workflows import MemoryStore, StoreUnavailable, WorkerOptions, WorkflowWorker
from tests.conftest import await_until

LOGGER = "pyrula.workflows.worker"

#: Small intervals so a test finishes in well under a second of worker time.
FAST: dict[str, Any] = {
    "claim_poll_interval": 0.01,
    "timer_poll_interval_s": 0.05,
    "lock_ttl": 1.0,
    "shutdown_grace": 2.0,
    "cancel_timeout": 1.0,
}


def fast_options(**overrides: Any) -> WorkerOptions:
    return WorkerOptions(**{**FAST, **overrides})


async def start(worker: WorkflowWorker) -> asyncio.Task[None]:
    """``asyncio.create_task(worker.run())``, returned once the worker serves (or died)."""
    task = asyncio.create_task(worker.run())
    await await_until(lambda: worker.state != "starting" or task.done(), what="worker start")
    if task.done():
        task.result()
    return task


async def stop(worker: WorkflowWorker, task: asyncio.Task[None], deadline: float = 30.0) -> None:
    worker.stop()
    await asyncio.wait_for(task, deadline)


@asynccontextmanager
async def serving(worker: WorkflowWorker) -> AsyncIterator[asyncio.Task[None]]:
    """Run the worker for the body of a ``with`` block; stop it and await ``run()`` after."""
    task = await start(worker)
    try:
        yield task
    except BaseException:
        worker.stop()
        await asyncio.wait({task}, timeout=30)
        raise
    await stop(worker, task)


def logged(caplog: pytest.LogCaptureFixture, event: str) -> list[logging.LogRecord]:
    """Records of the worker's logger whose ``event`` (its documented name) is ``event``."""
    return [
        r for r in caplog.records
        if getattr(r, "event", None) == event or r.getMessage().startswith(event + ":")
    ]


def capture(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)


def claim_cut(caplog: pytest.LogCaptureFixture) -> bool:
    """Whether a shutdown had to cancel a claim loop that had not ended by itself within
    the grace (step 3 says so)."""
    return any(r.getMessage().startswith("shutdown: 3/5")
               and "a claim that has not answered" in r.getMessage() for r in caplog.records)


class Spy:
    """Records every call of some methods of one store instance (args and result)."""

    def __init__(self, store: Any, *methods: str) -> None:
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any], Any]] = []
        for method in methods:
            setattr(store, method, self._wrap(method, getattr(store, method)))

    def _wrap(self, method: str, real: Callable[..., Awaitable[Any]]) -> Callable[..., Any]:
        async def spy(*args: Any, **kwargs: Any) -> Any:
            result = await real(*args, **kwargs)
            self.calls.append((method, args, kwargs, result))
            return result

        return spy

    def count(self, method: str, run_id: str | None = None) -> int:
        return sum(
            1 for m, args, _, _ in self.calls
            if m == method and (run_id is None or (args and args[0] == run_id))
        )

    def of(self, method: str) -> list[tuple[tuple[Any, ...], dict[str, Any], Any]]:
        return [(a, k, r) for m, a, k, r in self.calls if m == method]


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


class Outage:
    """While ``active``, one store method raises ``error`` instead of answering."""

    def __init__(
        self, store: Any, method: str, error: Callable[[], BaseException] | None = None
    ) -> None:
        self.active = False
        self.failures = 0
        self._real = getattr(store, method)
        self._error = error or (lambda: StoreUnavailable(f"injected: {method} is down"))
        self.when: Callable[..., bool] = lambda *a, **k: True
        setattr(store, method, self._call)

    async def _call(self, *args: Any, **kwargs: Any) -> Any:
        if self.active and self.when(*args, **kwargs):
            self.failures += 1
            raise self._error()
        return await self._real(*args, **kwargs)


async def http_text(address: tuple[str, int] | None, path: str) -> tuple[int, str]:
    """GET ``path`` from the probe server; (status, body text)."""
    assert address is not None, "the probe server is not bound"
    reader, writer = await asyncio.open_connection(*address)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: probe\r\n\r\n".encode())
        await writer.drain()
        data = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
        await writer.wait_closed()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body.decode()


async def http_get(address: tuple[str, int] | None, path: str) -> tuple[int, Any]:
    """GET ``path`` from the probe server; (status, JSON body)."""
    status, body = await http_text(address, path)
    return status, json.loads(body)


def of_type(events: list[dict[str, Any]], type_: str) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == type_]


def shape(events: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """A journal without timestamps and worker ids: what must not depend on batching."""
    return [
        (e["seq"], e["type"], e.get("step"), e.get("call"), json.dumps(e.get("result")))
        for e in events
    ]


def unique(prefix: str) -> str:
    """A key no other test (or store variant of the same test) uses."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"
