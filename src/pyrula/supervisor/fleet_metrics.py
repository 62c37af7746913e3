"""The fleet's /metrics: its children's metrics summed, and what only the fleet counts.

Each child reports its metrics every ``METRICS_INTERVAL`` and once more as it exits. The
fleet serves the sum over its live children plus the counters and histograms of every
child that exited: a recycled or killed child's counts are kept, so a fleet-wide counter
never goes down when a child is replaced (Prometheus would read that as a reset). Its
gauges (in-flight runs) leave with it. A kill -9 loses what the child counted since its
last report, at most ``METRICS_INTERVAL`` of it.

What the supervisor itself does is counted here too: the runs of a dead child it puts
back (``pyrula_runs_requeued_total{reason="orphaned"}``). The queue gauges are read from
the store by the fleet at each scrape (the children do not send them: summing the same
queue once per child would multiply it).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from typing import Any

from pyrula.logs import FLEET_LOGGER
from pyrula.metrics import QUEUE_STATS_TIMEOUT_S, Metrics, merge, set_queue_gauges
from pyrula.workflows.clock import store_clock
from pyrula.workflows.stores.capabilities import QueueStat, capabilities_of

logger = logging.getLogger(FLEET_LOGGER)


#: How often the fleet reads its store's clock again (it is carried forward in between).
CLOCK_RESYNC_S = 30.0
#: Queue figures this fresh answer a scrape or a scaling tick without a store call.
QUEUE_FRESH_S = 0.4


class FleetMetrics:
    def __init__(self, store: Any) -> None:
        self.own = Metrics()
        self._retired: dict[str, Any] = {}
        self._store = store
        self._queues = capabilities_of(store).queue_stats
        self._clock = store_clock(store)
        self._synced_at = float("-inf")
        #: (when read, monotonic; the names; now on the store's clock; the figures)
        self._last: tuple[float, tuple[str, ...], float, dict[str, QueueStat]] | None = None

    async def _store_now(self) -> float:
        """Epoch seconds on the store's clock, read again every ``CLOCK_RESYNC_S`` and
        carried forward by the monotonic clock meanwhile (the host's clock for a store
        without one, or until the store answers)."""
        clock = self._clock
        if clock is None:
            return time.time()
        if time.monotonic() - self._synced_at > CLOCK_RESYNC_S:
            try:
                await clock.sync()
                self._synced_at = time.monotonic()
            except Exception:  # the clock carries its last reading (or the host's) on
                logger.debug("the store's clock was not read", exc_info=True)
        return clock.now()

    async def queue_figures(self, names: list[str]
                            ) -> tuple[float, dict[str, QueueStat]] | None:
        """(now on the store's clock, the queue of each of ``names``); None when the store
        cannot tell or did not answer in time. One store call serves the scrapes and the
        scaling ticks of ``QUEUE_FRESH_S``; no names: no queue."""
        if self._queues is None:
            return None
        if not names:
            return time.time(), {}
        key, last = tuple(names), self._last
        if last is not None and last[1] == key and time.monotonic() - last[0] < QUEUE_FRESH_S:
            return last[2], last[3]
        try:
            now = await self._store_now()
            stats = await asyncio.wait_for(self._queues.queue_stats(names),
                                           QUEUE_STATS_TIMEOUT_S)
        except Exception as exc:  # any store trouble: this scrape or tick goes without them
            logger.debug("queue figures not read: %s", exc)
            return None
        self._last = (time.monotonic(), key, now, stats)
        return now, stats

    async def read_queues(self, names: list[str]) -> None:
        """Set the queue gauges of ``names`` (left as they were if the store cannot tell)."""
        figures = await self.queue_figures(names)
        if figures is not None and names:
            set_queue_gauges(self.own, figures[1], figures[0])

    def retire(self, families: dict[str, Any]) -> None:
        """Keep the counters and histograms of a child that exited."""
        lasting = {name: family for name, family in families.items()
                   if family.get("type") in ("counter", "histogram")}
        if lasting:
            self._retired = merge([self._retired, lasting])

    def families(self, live: Iterable[dict[str, Any]]) -> dict[str, Any]:
        """The fleet's families: the live children's reports, the exited children's
        counts and the fleet's own, summed."""
        return merge([self._retired, *live, self.own.samples()])
