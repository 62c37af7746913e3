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

import time
from collections.abc import Iterable
from typing import Any

from pyrula.metrics import Metrics, merge, record_queues
from pyrula.workflows.clock import store_clock
from pyrula.workflows.stores.capabilities import capabilities_of


class FleetMetrics:
    def __init__(self) -> None:
        self.own = Metrics()
        self._retired: dict[str, Any] = {}

    async def read_queues(self, store: Any, names: list[str]) -> None:
        """Set the queue gauges of ``names`` from the store, if it can tell."""
        queues = capabilities_of(store).queue_stats
        if queues is None or not names:
            return
        clock = store_clock(store)
        if clock is not None:
            try:
                await clock.sync()
            except Exception:  # the host's clock then; the figures are a gauge
                clock = None
        now = clock.now() if clock is not None else time.time()
        await record_queues(self.own, queues, names, now)

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
