"""The fleet's /metrics: its children's metrics summed, and what only the fleet counts.

Each child reports its metrics every ``METRICS_INTERVAL`` and once more as it exits. The
fleet serves the sum over its live children plus the counters and histograms of every
child that exited: a recycled or killed child's counts are kept, so a fleet-wide counter
never goes down when a child is replaced (Prometheus would read that as a reset). Its
gauges (in-flight runs) leave with it. A kill -9 loses what the child counted since its
last report, at most ``METRICS_INTERVAL`` of it.

What the supervisor itself does is counted here too: the runs of a dead child it puts
back (``pyrula_runs_requeued_total{reason="orphaned"}``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pyrula.metrics import Metrics, merge


class FleetMetrics:
    def __init__(self) -> None:
        self.own = Metrics()
        self._retired: dict[str, Any] = {}

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
