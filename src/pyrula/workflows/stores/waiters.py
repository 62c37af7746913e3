"""Waking clients that wait on a run's result, across threads and event loops."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable

from pyrula.workflows.records import RunInfo

Check = Callable[[str], Awaitable[RunInfo | None]]


class ResultWaiters:
    """Futures keyed by run id; ``notify`` resolves them from any thread.

    A store whose writers may live in other processes (SQLite) also passes ``poll``, the
    longest it trusts the absence of a notification; the wait re-checks at most that often,
    backing off from 10 ms, never in a tight loop.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: dict[str, list[asyncio.Future[None]]] = {}

    def notify(self, run_id: str) -> None:
        with self._lock:
            futures = self._waiting.pop(run_id, [])
        for fut in futures:
            fut.get_loop().call_soon_threadsafe(_wake, fut)

    async def wait(
        self, run_id: str, check: Check, timeout: float | None, poll: float | None = None
    ) -> RunInfo:
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        interval = 0.01
        while True:
            fut: asyncio.Future[None] = loop.create_future()
            with self._lock:
                self._waiting.setdefault(run_id, []).append(fut)
            try:
                # Check after registering, so a notify between the two is not lost.
                info = await check(run_id)
                if info is not None:
                    return info
                wait: float | None = None
                if deadline is not None:
                    wait = deadline - loop.time()
                    if wait <= 0:
                        raise TimeoutError(f"run {run_id} did not end within {timeout} s")
                if poll is not None:
                    wait = interval if wait is None else min(wait, interval)
                    interval = min(poll, interval * 2)
                try:
                    await asyncio.wait_for(asyncio.shield(fut), wait)
                except TimeoutError:
                    pass
            finally:
                with self._lock:
                    futures = self._waiting.get(run_id)
                    if futures is not None and fut in futures:
                        futures.remove(fut)
                        if not futures:
                            del self._waiting[run_id]


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
