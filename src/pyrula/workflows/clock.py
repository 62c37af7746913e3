"""The clock every loop and store call takes, so tests can drive time by hand."""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


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


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
