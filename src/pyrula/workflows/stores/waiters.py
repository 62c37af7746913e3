"""Waking clients that wait on a run's result, across threads and event loops."""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager

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
        if not futures:
            return
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        for fut in futures:
            loop = fut.get_loop()
            if loop is running:  # no need to wake a loop from its own thread
                loop.call_soon(_wake, fut)
            else:
                loop.call_soon_threadsafe(_wake, fut)

    async def wait(
        self, run_id: str, check: Check, timeout: float | None, poll: float | None = None,
        first_poll: float = 0.01,
    ) -> RunInfo:
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        interval = first_poll
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


class EndWatch:
    """For a store whose runs may end in another process (SQLite): the runs the waiters
    on one event loop wait for, looked up together by one ``ended`` call per round, every
    ``MIN_INTERVAL`` while ends keep coming, backing off to ``max_interval`` while none
    do. The runs it finds ended are kept for ``found`` and their waiters woken through
    ``waiters``, instead of each waiter polling its own run."""

    MIN_INTERVAL = 0.005

    def __init__(
        self,
        waiters: ResultWaiters,
        ended: Callable[[list[str]], Awaitable[dict[str, RunInfo]]],
        max_interval: float,
    ) -> None:
        self._waiters = waiters
        self._ended = ended
        self._max = max_interval
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Watched] = (
            weakref.WeakKeyDictionary()
        )

    def found(self, run_id: str) -> RunInfo | None:
        """The ended run, if this loop's rounds found it ended: once (another waiter of
        the same run reads its own copy)."""
        watched = self._loops.get(asyncio.get_running_loop())
        return None if watched is None else watched.ended.pop(run_id, None)

    @contextmanager
    def watching(self, run_id: str) -> Iterator[None]:
        """While in the block, ``run_id`` is looked up by this loop's round."""
        loop = asyncio.get_running_loop()
        watched = self._loops.get(loop)
        if watched is None or watched.task is None or watched.task.done():
            watched = self._loops[loop] = _Watched()
            watched.task = loop.create_task(self._rounds(loop, watched), name="pyrula-end-watch")
        watched.runs[run_id] += 1
        if watched.delay > self.MIN_INTERVAL:  # backed off: look soon again
            watched.delay = self.MIN_INTERVAL
            watched.kick.set()
        try:
            yield
        finally:
            watched.runs[run_id] -= 1
            if watched.runs[run_id] <= 0:
                del watched.runs[run_id]
                watched.ended.pop(run_id, None)

    async def _rounds(self, loop: asyncio.AbstractEventLoop, watched: _Watched) -> None:
        try:
            while watched.runs:
                try:
                    await asyncio.wait_for(watched.kick.wait(), watched.delay)
                except TimeoutError:
                    pass
                if watched.kick.is_set():  # a new waiter checks its run itself first
                    watched.kick.clear()
                    await asyncio.sleep(self.MIN_INTERVAL)
                if not watched.runs:
                    break
                try:
                    ended = await self._ended(list(watched.runs))
                except Exception:  # the waiters' own (rarer) checks carry on meanwhile
                    ended = {}
                for run_id, info in ended.items():
                    if run_id in watched.runs:
                        watched.ended[run_id] = info
                        self._waiters.notify(run_id)
                watched.delay = (
                    self.MIN_INTERVAL if ended else min(self._max, watched.delay * 2)
                )
        finally:
            if self._loops.get(loop) is watched:
                del self._loops[loop]


class _Watched:
    __slots__ = ("runs", "ended", "task", "delay", "kick")

    def __init__(self) -> None:
        self.runs: Counter[str] = Counter()
        self.ended: dict[str, RunInfo] = {}
        self.task: asyncio.Task[None] | None = None
        self.delay = EndWatch.MIN_INTERVAL
        self.kick = asyncio.Event()


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
