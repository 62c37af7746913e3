"""The clock every loop and store call takes, so tests can drive time by hand."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from pyrula.workflows.stores.capabilities import capabilities_of


class Clock(Protocol):
    def now(self) -> float:
        """Wall-clock epoch seconds, for persisted timestamps."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back, for deadlines and intervals."""
        ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class StoreClock:
    """Wall-clock time as the store's server reads it, for a worker whose own clock may be
    wrong or jump.

    Every lock, shard lease and timer a worker writes or judges is a wall-clock instant
    compared with instants other workers wrote, so they must all read one clock: the
    store's. ``sync`` reads the server's time (one round trip) and notes the monotonic
    instant halfway through it; ``now`` is that reading carried forward by the monotonic
    clock, which an NTP step or ``date -s`` does not move. So a host whose clock jumps an
    hour does not see every other worker's lock lapse at once (forward) or write locks that
    others find lapsed already (back), and timers fire when they are due on the server.
    Until the first ``sync`` it reads ``fallback``. Safe to read from any thread.
    """

    def __init__(self, read_server_time: Callable[[], Awaitable[float]],
                 fallback: Clock | None = None) -> None:
        self._read = read_server_time
        self._fallback = fallback if fallback is not None else SYSTEM_CLOCK
        #: (the server's epoch seconds, the monotonic instant they were read at)
        self._anchor: tuple[float, float] | None = None

    async def sync(self) -> None:
        sent = time.monotonic()
        server = await self._read()
        received = time.monotonic()
        self._anchor = (server, (sent + received) / 2)

    def now(self) -> float:
        anchor = self._anchor
        if anchor is None:
            return self._fallback.now()
        return anchor[0] + (time.monotonic() - anchor[1])

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class ManualClock:
    """A clock that moves only when told; ``sleep`` returns once ``advance`` passes it."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self._now = start
        self._mono = 0.0
        self._waiters: list[tuple[float, asyncio.Future[None]]] = []

    def now(self) -> float:
        return self._now

    def monotonic(self) -> float:
        return self._mono

    def advance(self, seconds: float) -> None:
        self._now += seconds
        self._mono += seconds
        due = [w for w in self._waiters if w[0] <= self._mono]
        self._waiters = [w for w in self._waiters if w[0] > self._mono]
        for _, fut in due:
            fut.get_loop().call_soon_threadsafe(_resolve, fut)

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((self._mono + seconds, fut))
        await fut


SYSTEM_CLOCK: Clock = SystemClock()


def store_clock(store: object) -> StoreClock | None:
    """A ``StoreClock`` over ``store``'s server time, if the store has a clock of its own
    (``ServerClock``); None for a store whose clock is the host's (memory, SQLite)."""
    server = capabilities_of(store).server_clock
    return StoreClock(server.server_time) if server is not None else None


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
