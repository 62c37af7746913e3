"""The timer loop: queue parked runs whose wake time passed (``run:woken``).

It looks again at once after a batch that woke runs; otherwise it sleeps the timer poll
interval, or less: until the soonest timer it knows of, one of a run this worker parked
(``note_timer`` shortens a wait under way) or the store's next one (``TimerIndex``).
"""

from __future__ import annotations

import asyncio
import logging

from pyrula.metrics import Metrics
from pyrula.workflows.clock import Clock
from pyrula.workflows.stores.base import Store
from pyrula.workflows.stores.capabilities import TimerIndex
from pyrula.workflows.worker.loops import first
from pyrula.workflows.worker.runtime import Runtime

logger = logging.getLogger(__name__)


class TimerLoop:
    name = "timer"

    def __init__(
        self,
        store: Store,
        index: TimerIndex | None,
        clock: Clock,
        *,
        interval: float,
        batch: int,
        runtime: Runtime,
        metrics: Metrics,
    ) -> None:
        self.interval = interval
        self._store = store
        self._index = index
        self._clock = clock
        self._batch = batch
        self._rt = runtime
        self._metrics = metrics
        #: The soonest timer of a run this worker parked, and the nudge that shortens the
        #: wait for it.
        self._soonest: float | None = None
        self._nudge = asyncio.Event()

    def start(self) -> None:
        """Bind to the running event loop."""
        self._nudge = asyncio.Event()

    async def tick(self, now: float) -> float | None:
        if self._soonest is not None and self._soonest <= now:
            self._soonest = None  # this tick wakes it
        woken = await self._store.wake_due(now=now, limit=self._batch)
        if woken:
            self._metrics.inc("pyrula.workflows.timers.woken", woken)
            # Look again at once: a batch can come back short while more are due (when the
            # store spreads it over shards).
            return 0.0
        # None due: wait the interval, or less, until the soonest timer known: one of a run
        # this worker parked (which nudges this wait), or the store's next one.
        known = [t for t in (self._soonest, self._store_next_wake()) if t is not None]
        wait = self.interval
        if known:
            wait = min(wait, max(0.0, min(known) - self._clock.now()))
        self._nudge.clear()
        sleeping = asyncio.ensure_future(asyncio.sleep(wait))
        await first(sleeping, self._nudge.wait(), self._rt.stopping.wait())
        return 0.0

    def _store_next_wake(self) -> float | None:
        at = self._index.next_wake_at() if self._index is not None else None
        return None if at is None else float(at)

    def note_timer(self, wake_at: float) -> None:
        """A run this worker parked falls due at ``wake_at``: do not sleep past it."""
        if self._soonest is None or wake_at < self._soonest:
            self._soonest = wake_at
            self._nudge.set()
