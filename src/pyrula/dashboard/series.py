"""Throughput and latency over the last few minutes, sampled from the fleet's counters.

The fleet's metrics are cumulative (``pyrula_runs_completed_total``, the run-duration and
claim-latency histograms). A chart wants rates: every ``interval`` the sampler reads them,
and each point of the ring buffer is the difference with the previous reading: runs
completed per second, and the mean and the 95th percentile (from the histogram buckets)
of the runs and claims that ended in that second. Pure but for :meth:`Sampler.run`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pyrula.timestamps import iso_utc

logger = logging.getLogger(__name__)

#: Seconds of history kept: the charts show the last five minutes.
WINDOW_S = 300.0
INTERVAL_S = 1.0
COMPLETED = "pyrula_runs_completed"
FAILED = "pyrula_runs_failed"
RUN_DURATION = "pyrula_run_duration_seconds"
CLAIM_LATENCY = "pyrula_claim_latency_seconds"


@dataclass(frozen=True, slots=True)
class Reading:
    """The cumulative figures at one moment."""

    at: float
    completed: float
    failed: float
    #: histogram name -> (count, sum, {upper bound: cumulative count})
    histograms: dict[str, tuple[float, float, dict[float, float]]]


def counter_total(families: dict[str, Any], name: str) -> float:
    """A counter family's samples summed over their labels (0 when absent)."""
    family = families.get(name) or {}
    return float(sum(value for sample, _labels, value in family.get("samples", ())
                     if sample.endswith("_total")))


def histogram(families: dict[str, Any], name: str) -> tuple[float, float, dict[float, float]]:
    """(count, sum, cumulative buckets) of a histogram family over all its labels."""
    family = families.get(name) or {}
    count = total = 0.0
    buckets: dict[float, float] = {}
    for sample, labels, value in family.get("samples", ()):
        if sample.endswith("_count"):
            count += value
        elif sample.endswith("_sum"):
            total += value
        elif sample.endswith("_bucket"):
            bound = float(labels.get("le", "inf"))
            buckets[bound] = buckets.get(bound, 0.0) + value
    return count, total, buckets


def read(families: dict[str, Any], at: float) -> Reading:
    return Reading(at, counter_total(families, COMPLETED), counter_total(families, FAILED),
                   {name: histogram(families, name) for name in (RUN_DURATION, CLAIM_LATENCY)})


def quantile(buckets: dict[float, float], q: float) -> float | None:
    """The ``q`` quantile of observations counted in cumulative ``buckets``, interpolated
    within its bucket as Prometheus' ``histogram_quantile`` does; None without any."""
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return None
    rank = q * buckets[bounds[-1]]
    lower, below = 0.0, 0.0
    for bound in bounds:
        upto = buckets[bound]
        if upto >= rank:
            if math.isinf(bound):
                return lower
            inside = upto - below
            share = 0.0 if inside <= 0 else (rank - below) / inside
            return lower + (bound - lower) * share
        lower, below = bound, upto
    return lower


def point(before: Reading, after: Reading) -> dict[str, Any]:
    """One chart point: the rates and latencies between two readings. A counter that went
    down (the fleet restarted) counts from zero."""
    span = max(after.at - before.at, 1e-6)

    def grew(now: float, then: float) -> float:
        return now - then if now >= then else now

    out: dict[str, Any] = {
        "at": iso_utc(after.at),
        "completed_per_s": round(grew(after.completed, before.completed) / span, 3),
        "failed_per_s": round(grew(after.failed, before.failed) / span, 3),
    }
    for name, key in ((RUN_DURATION, "run"), (CLAIM_LATENCY, "claim")):
        count, total, buckets = after.histograms[name]
        count0, total0, buckets0 = before.histograms[name]
        reset = count < count0
        n = count if reset else count - count0
        s = total if reset else total - total0
        delta = buckets if reset else {b: v - buckets0.get(b, 0.0) for b, v in buckets.items()}
        out[f"{key}_count"] = n
        out[f"{key}_mean_s"] = None if n <= 0 else round(s / n, 6)
        out[f"{key}_p95_s"] = None if n <= 0 else _rounded(quantile(delta, 0.95))
    return out


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 6)


@dataclass
class Series:
    """The ring buffer of chart points (the last ``window`` seconds)."""

    interval: float = INTERVAL_S
    window: float = WINDOW_S
    points: deque[dict[str, Any]] = field(default_factory=deque)
    last: Reading | None = None

    def __post_init__(self) -> None:
        self.points = deque(maxlen=max(2, int(self.window / self.interval)))

    def add(self, reading: Reading) -> None:
        if self.last is not None:
            self.points.append(point(self.last, reading))
        self.last = reading

    def body(self) -> dict[str, Any]:
        return {"interval_s": self.interval, "window_s": self.window,
                "points": list(self.points)}


class Sampler:
    """Reads ``families()`` (the fleet's summed metrics) every ``interval`` into a
    :class:`Series`, on the event loop it is started on."""

    def __init__(self, families: Callable[[], dict[str, Any]],
                 interval: float = INTERVAL_S, window: float = WINDOW_S) -> None:
        self.families = families
        self.series = Series(interval, window)

    def sample(self) -> None:
        try:
            self.series.add(read(self.families(), time.time()))
        except Exception:  # a chart must not take the fleet down
            logger.exception("dashboard sample failed")

    async def run(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(self.series.interval)
