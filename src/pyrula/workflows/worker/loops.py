"""Background loops: each one a ``tick(now)`` run on an interval, restarted on store errors.

A loop failing on a store or network error is logged once per outage and restarted with
a jittered delay doubling from 0.5 to 30 s (counted in ``pyrula.workflows.loop.restarts``).
Any other exception is fatal: it propagates to the worker, which stops and re-raises it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from pyrula.backoff import BACKOFF_MAX as BACKOFF_MAX  # the loops' restart delays
from pyrula.backoff import BACKOFF_MIN as BACKOFF_MIN
from pyrula.backoff import backoff_delays as backoff_delays
from pyrula.errors import StoreUnavailable
from pyrula.metrics import Metrics
from pyrula.workflows.clock import Clock

logger = logging.getLogger(__name__)

#: Errors that mean "the store or the network is having a bad moment".
TRANSIENT: tuple[type[BaseException], ...] = (
    StoreUnavailable,
    ConnectionError,
    TimeoutError,
    OSError,
)

#: /livez fails once a loop has been failing this long without a completed tick
#: (``failing_loop``; read at each call, so a test may lower it).
LIVENESS_FAILURE_S = 120.0


class Loop(Protocol):
    """One of a worker's loops: ``tick(now)`` is one pass, ``now`` the clock's time when it
    began; it returns how long to wait before the next pass (None: ``interval``)."""

    name: str
    interval: float

    async def tick(self, now: float) -> float | None: ...


@dataclass(slots=True)
class LoopState:
    name: str
    failing_since: float | None = None
    last_ok: float | None = None
    #: when a tick last failed on a store or network error (monotonic)
    last_failed: float | None = None
    restarts: int = 0

    def failed_for(self, now: float) -> float:
        return 0.0 if self.failing_since is None else now - self.failing_since


def failing_loop(states: Iterable[LoopState], now: float) -> str | None:
    """The first loop whose ticks have failed for ``LIVENESS_FAILURE_S`` (monotonic ``now``)
    without one completing since: what fails /livez.

    Judged from the first failed tick of the outage, never from the last completed tick: a
    loop with an interval over the window (``reconcile_interval=300``) is not failing while
    it waits for its next tick, only from the window after a failed tick until a tick
    completes."""
    for state in states:
        if state.failed_for(now) >= LIVENESS_FAILURE_S:
            return state.name
    return None


async def run_loop(
    state: LoopState,
    loop: Loop,
    clock: Clock,
    stopping: asyncio.Event,
    metrics: Metrics,
    log_extra: dict[str, str],
    monotonic: Callable[[], float] = time.monotonic,
) -> None:
    """Run ``loop.tick`` every ``loop.interval`` seconds (or what it returns) until
    ``stopping``; ``state`` says when ticks failed and completed, by ``monotonic``."""
    delays = backoff_delays()
    while not stopping.is_set():
        try:
            wait = await loop.tick(clock.now())
        except TRANSIENT as exc:
            state.last_failed = monotonic()
            if state.failing_since is None:
                state.failing_since = state.last_failed
                logger.warning(
                    "loop_failed: %s loop failed on a store/network error (%s: %s); "
                    "restarting with backoff", state.name, type(exc).__name__, exc,
                    extra={"event": "loop_failed", "loop": state.name, **log_extra},
                )
            state.restarts += 1
            metrics.inc("pyrula.workflows.loop.restarts", loop=state.name)
            wait = delays()
        else:
            if state.failing_since is not None:
                logger.info(
                    "loop_recovered: %s loop recovered after %.1f s", state.name,
                    monotonic() - state.failing_since,
                    extra={"event": "loop_recovered", "loop": state.name, **log_extra},
                )
                delays = backoff_delays()
            state.failing_since = None
            state.last_ok = monotonic()
        pause = loop.interval if wait is None else wait
        if pause > 0 or stopping.is_set():
            try:
                await asyncio.wait_for(stopping.wait(), pause)
            except TimeoutError:
                pass
        else:
            await asyncio.sleep(0)


async def first(*aws: Awaitable[Any]) -> None:
    """Wait until one of ``aws`` is done; cancel the others (a task passed in is cancelled
    too if it is not done)."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
