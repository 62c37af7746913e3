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
from pyrula.metrics import QUEUE_STATS_TIMEOUT_S, Metrics, merge, record_queues
from pyrula.workflows.clock import store_clock
from pyrula.workflows.stores.capabilities import QueueStat, capabilities_of

logger = logging.getLogger(FLEET_LOGGER)


async def _store_now(store: Any) -> float:
    """Epoch seconds on the store's clock (the host's if it has none or it fails)."""
    clock = store_clock(store)
    if clock is not None:
        try:
            await clock.sync()
        except Exception:  # the host's clock then; the figures are a gauge
            clock = None
    return clock.now() if clock is not None else time.time()


class FleetMetrics:
    def __init__(self) -> None:
        self.own = Metrics()
        self._retired: dict[str, Any] = {}

    async def read_queues(self, store: Any, names: list[str]) -> None:
        """Set the queue gauges of ``names`` from the store, if it can tell."""
        queues = capabilities_of(store).queue_stats
        if queues is None or not names:
            return
        await record_queues(self.own, queues, names, await _store_now(store))

    async def queue_figures(
        self, store: Any, names: list[str]
    ) -> tuple[float, dict[str, QueueStat]] | None:
        """(now on the store's clock, the queue of each of ``names``) for elastic sizing;
        None when the store cannot tell or did not answer in time. No names: no queue."""
        queues = capabilities_of(store).queue_stats
        if queues is None:
            return None
        if not names:
            return time.time(), {}
        try:
            now = await _store_now(store)
            stats = await asyncio.wait_for(queues.queue_stats(names), QUEUE_STATS_TIMEOUT_S)
        except Exception as exc:  # any store trouble: this tick goes without the queue
            logger.debug("queue figures not read for elastic sizing: %s", exc)
            return None
        return now, stats

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
