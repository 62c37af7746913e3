"""Metrics of workers and fleets: recorded under dotted names, served as Prometheus text.

A leaf module (like ``pyrula.wire``): the worker records with it, and the supervisor, which
never imports the worker, sums its children's reports with it.

The worker records each metric under the dotted name its logs and docs use
(``pyrula.workflows.loop.restarts``); :data:`CATALOG` gives the documented ones their
Prometheus name, type and labels (``pyrula_loop_restarts_total{loop}``). A dotted name not
in the catalog is still counted, exported as a counter named after it
(``pyrula.workflows.timers.woken`` → ``pyrula_workflows_timers_woken_total``).

Each worker keeps its own figures (:class:`Metrics`), so several workers in one process
(tests, an app embedding two) never mix them. They are plain numbers under a lock, kept in
the shape of Prometheus samples (``_total``, ``_bucket{le}``, ``_count``, ``_sum``):
recording needs nothing more, and ``prometheus_client`` (whose package brings its HTTP
exposition, ``http.server`` included) is imported only to render text for a scrape. A
fleet child sends its samples to its supervisor (:meth:`Metrics.samples`), which sums them
over its children; a child never imports ``prometheus_client``, which keeps it off the
path from a fork to the child's first claim.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

logger = logging.getLogger(__name__)

#: How long a scrape waits for the store's queue figures before serving without them.
QUEUE_STATS_TIMEOUT_S = 2.0
QUEUE_DEPTH = "pyrula.workflows.queue.depth"
QUEUE_AGE = "pyrula.workflows.queue.oldest_age"


class Kind(StrEnum):
    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"


#: Bucket bounds (seconds) of the duration histograms: from a 1 ms step to a day-long run.
DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                    10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 21600.0, 86400.0)
#: Claim latency (how long a claimable run waited): finer at the low end.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                   2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


@dataclass(frozen=True, slots=True)
class Spec:
    """How one dotted metric is exported."""

    prometheus: str  # without the ``_total`` a counter gets
    kind: Kind
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = DURATION_BUCKETS


def _spec(prometheus: str, kind: Kind, help: str, *labels: str,
          buckets: tuple[float, ...] = DURATION_BUCKETS) -> Spec:
    return Spec(prometheus, kind, help, labels, buckets)


C, G, H = Kind.COUNTER, Kind.GAUGE, Kind.HISTOGRAM

#: The documented metrics: dotted name → Prometheus name, type, help and labels.
CATALOG: dict[str, Spec] = {
    "pyrula.workflows.runs.started": _spec(
        "pyrula_runs_started", C, "Attempts begun (a run started again after a requeue "
        "counts again).", "workflow"),
    "pyrula.workflows.runs.completed": _spec(
        "pyrula_runs_completed", C, "Runs that completed.", "workflow"),
    "pyrula.workflows.runs.failed": _spec(
        "pyrula_runs_failed", C, "Runs that failed.", "workflow"),
    "pyrula.workflows.runs.cancelled": _spec(
        "pyrula_runs_cancelled", C, "Runs that were cancelled.", "workflow"),
    "pyrula.workflows.runs.requeued": _spec(
        "pyrula_runs_requeued", C, "Runs put back in the queue, by reason.", "reason"),
    "pyrula.workflows.step.duration": _spec(
        "pyrula_step_duration_seconds", H, "How long each try of a step ran.",
        "workflow", "step"),
    "pyrula.workflows.run.duration": _spec(
        "pyrula_run_duration_seconds", H, "From submit to the end of the run.", "workflow"),
    "pyrula.workflows.claim.latency": _spec(
        "pyrula_claim_latency_seconds", H, "How long a claimable run waited for its claim.",
        "workflow", buckets=LATENCY_BUCKETS),
    "pyrula.workflows.queue.depth": _spec(
        "pyrula_queue_depth", G, "Runs queued and claimable now.", "workflow"),
    "pyrula.workflows.queue.oldest_age": _spec(
        "pyrula_queue_oldest_age_seconds", G, "How long the longest-waiting claimable run "
        "has waited (0 when none waits).", "workflow"),
    "pyrula.workflows.runs.in_flight": _spec(
        "pyrula_runs_in_flight", G, "Runs this worker holds now."),
    "pyrula.workflows.step_threads.busy": _spec(
        "pyrula_step_threads_busy", G, "Sync-step threads running a step now."),
    "pyrula.workflows.step_threads.saturated": _spec(
        "pyrula_step_threads_saturated", C, "Times every sync-step thread was busy and a "
        "sync step had to wait for one."),
    "pyrula.workflows.loop.restarts": _spec(
        "pyrula_loop_restarts", C, "Background loop restarts after a store or network "
        "error.", "loop"),
    "pyrula.workflows.schedules.fired": _spec(
        "pyrula_schedules_fired", C, "Schedule occurrences submitted."),
    "pyrula.workflows.schedules.skipped": _spec(
        "pyrula_schedules_skipped", C, "Schedule occurrences skipped, by reason.", "reason"),
    "pyrula.workflows.triggers.started": _spec(
        "pyrula_trigger_runs_started", C, "Runs a batch trigger started, one per batch of "
        "events.", "workflow"),
    "pyrula.workflows.projections.folded": _spec(
        "pyrula_projection_runs_folded", C, "Ended runs folded into a projection (each once).",
        "projection"),
    "pyrula.workflows.archive.lag": _spec(
        "pyrula_archive_lag_seconds", G, "How long ago the oldest ended run that may not be "
        "archived yet ended (0 when the archive has caught up)."),
    "pyrula.workflows.journal_cache.hits": _spec(
        "pyrula_journal_cache_hits", C, "Resumed runs whose journal came from the cache."),
    "pyrula.fleet.scaled": _spec(
        "pyrula_fleet_scaled", C, "Elastic sizing decisions that changed the fleet's size, "
        "by direction (up, down).", "direction"),
    "pyrula.workflows.journal_cache.misses": _spec(
        "pyrula_journal_cache_misses", C, "Resumed runs whose journal was read from the "
        "store."),
}

#: How the fleet combines a gauge over its children (counters and histograms are summed):
#: the archive's lag is one figure, not one per child.
GAUGE_MAX = frozenset({"pyrula_archive_lag_seconds"})

#: (sample name, labels, value) of one sample, as sent from a fleet child.
Sample = tuple[str, dict[str, str], float]


#: A series' labels, as (name, value) pairs sorted by name.
LabelKey = tuple[tuple[str, str], ...]


def _le(bound: float) -> str:
    """A bucket's ``le`` label as Prometheus writes it (``0.001``, ``1.0``, ``+Inf``)."""
    return "+Inf" if bound == float("inf") else repr(float(bound))


class _Family:
    """One metric's series by labels: a number each (counter, gauge), or a histogram's
    bucket counts (not cumulative), sum and count."""

    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self.series: dict[LabelKey, Any] = {}

    def check(self, key: LabelKey) -> None:
        """Refuse labels other than the metric's own, as a Prometheus client does."""
        if tuple(sorted(self.spec.labels)) != tuple(name for name, _ in key):
            raise ValueError(f"metric {self.spec.prometheus} takes the labels "
                             f"{list(self.spec.labels)}, not {[n for n, _ in key]}")

    def samples(self) -> list[list[Any]]:
        """``[sample name, labels, value]`` of every series, as Prometheus names them."""
        spec, out = self.spec, []
        for key, value in self.series.items():
            labels = dict(key)
            ordered = {name: labels[name] for name in spec.labels}
            if spec.kind is Kind.COUNTER:
                out.append([spec.prometheus + "_total", ordered, value[0]])
            elif spec.kind is Kind.GAUGE:
                out.append([spec.prometheus, ordered, value])
            else:
                out.extend(self._histogram(ordered, value))
        return out

    def _histogram(self, labels: dict[str, str], value: list[float]) -> list[list[Any]]:
        name, bounds = self.spec.prometheus, (*self.spec.buckets, float("inf"))
        counts, total, count = value[:-2], value[-2], value[-1]
        out, running = [], 0.0
        for bound, n in zip(bounds, counts, strict=True):
            running += n
            out.append([name + "_bucket", {**labels, "le": _le(bound)}, running])
        out.append([name + "_count", labels, count])
        out.append([name + "_sum", labels, total])
        return out


def _observe(family: _Family, key: LabelKey, value: float) -> None:
    buckets = family.spec.buckets
    # A count per bucket and +Inf, then the sum and the count.
    _count(_cell(family, key, len(buckets) + 3), buckets, value)


def _count(kept: list[float], buckets: tuple[float, ...], value: float) -> None:
    """Count ``value`` in a histogram's numbers (``kept``: one per bucket, then the sum and
    the count)."""
    kept[bisect.bisect_left(buckets, value)] += 1
    kept[-2] += value
    kept[-1] += 1


def _cell(family: _Family, key: LabelKey, size: int) -> list[float]:
    kept: list[float] | None = family.series.get(key)
    if kept is None:
        kept = family.series[key] = [0.0] * size
    return kept


class _Handle:
    """One labelled series, found once for a path that records it often. Like a call of
    ``Metrics.inc`` or ``observe``, it shows in a scrape from its first record on.

    It records without the lock: a handle is for one thread's path (a worker's event
    loop). A scrape from another thread reads each number whole."""

    __slots__ = ("_metrics", "_name", "_key", "_kept")

    def __init__(self, metrics: Metrics, name: str, labels: dict[str, str]) -> None:
        self._metrics, self._name = metrics, name
        self._key: LabelKey = tuple(sorted(labels.items()))
        self._kept: list[float] | None = None

    def _found(self, kind: Kind) -> list[float]:
        metrics = self._metrics
        with metrics._lock:
            family = metrics._family(self._name, self._key, kind)
            size = 1 if kind is Kind.COUNTER else len(family.spec.buckets) + 3
            kept = self._kept = _cell(family, self._key, size)
            return kept


class Counter(_Handle):
    """A counter's series (``Metrics.counter``)."""

    __slots__ = ()

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError(f"counter {self._name} can only go up, not by {amount}")
        (self._kept or self._found(Kind.COUNTER))[0] += amount


class Histogram(_Handle):
    """A histogram's series (``Metrics.histogram``)."""

    __slots__ = ("_buckets",)

    def __init__(self, metrics: Metrics, name: str, labels: dict[str, str]) -> None:
        super().__init__(metrics, name, labels)
        spec = CATALOG.get(name)
        self._buckets = DURATION_BUCKETS if spec is None else spec.buckets

    def observe(self, value: float) -> None:
        _count(self._kept or self._found(Kind.HISTOGRAM), self._buckets, value)


class Metrics:
    """A worker's counters, gauges and histograms, by dotted name and labels."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._families: dict[str, _Family] = {}

    def _family(self, name: str, key: LabelKey, kind: Kind) -> _Family:
        family = self._families.get(name)
        if family is None:
            spec = CATALOG.get(name) or Spec(name.replace(".", "_"), kind, name,
                                            tuple(label for label, _ in key))
            family = self._families.setdefault(name, _Family(spec))
        if key not in family.series:
            family.check(key)
        return family

    def inc(self, name: str, amount: float = 1.0, **labels: str) -> None:
        if amount < 0:
            raise ValueError(f"counter {name} can only go up, not by {amount}")
        key = tuple(sorted(labels.items()))
        with self._lock:
            _cell(self._family(name, key, Kind.COUNTER), key, 1)[0] += amount

    def counter(self, name: str, **labels: str) -> Counter:
        """Counter ``name`` with ``labels``, found once (``Counter``)."""
        return Counter(self, name, labels)

    def histogram(self, name: str, **labels: str) -> Histogram:
        """Histogram ``name`` with ``labels``, found once (``Histogram``)."""
        return Histogram(self, name, labels)

    def set(self, name: str, value: float, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        with self._lock:
            self._family(name, key, Kind.GAUGE).series[key] = float(value)

    def observe(self, name: str, value: float, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        with self._lock:
            _observe(self._family(name, key, Kind.HISTOGRAM), key, value)

    def forget(self, name: str, keep: Iterable[dict[str, str]]) -> None:
        """Drop the labelled series of gauge ``name`` other than ``keep`` (a workflow's
        queue that is no longer served stops being reported)."""
        kept = {tuple(sorted(labels.items())) for labels in keep}
        with self._lock:
            family = self._families.get(name)
            if family is not None:
                family.series = {k: v for k, v in family.series.items() if k in kept}

    def get(self, name: str, **labels: str) -> float:
        """A counter's or gauge's value; summed over the labels not given. (For a
        histogram: how many values it observed.)"""
        with self._lock:
            family = self._families.get(name)
            if family is None:
                return 0.0
            # A histogram's count is its last number, a counter's its only one.
            cells = family.spec.kind is not Kind.GAUGE
            return sum(float(value[-1] if cells else value)
                       for key, value in family.series.items()
                       if all(dict(key).get(k) == v for k, v in labels.items()))

    def prometheus(self) -> str:
        """The Prometheus text exposition of every metric recorded so far."""
        return render(self.samples())

    def samples(self) -> dict[str, Any]:
        """name → {"type", "help", "samples": [[sample name, labels, value], ...]}: every
        family, for a scrape or a fleet child's report."""
        with self._lock:
            return {family.spec.prometheus: {"type": family.spec.kind.value,
                                             "help": family.spec.help,
                                             "samples": family.samples()}
                    for family in self._families.values()}


async def record_queues(metrics: Metrics, source: Any, names: Sequence[str], now: float) -> None:
    """Set the queue gauges of ``names`` from ``source.queue_stats`` (a store's
    ``QueueStats``) as of ``now`` (the store's clock). A store that does not answer within
    ``QUEUE_STATS_TIMEOUT_S`` leaves them as they were: the scrape still answers."""
    try:
        stats = await asyncio.wait_for(source.queue_stats(list(names)), QUEUE_STATS_TIMEOUT_S)
    except Exception as exc:  # any store trouble: the rest of the scrape is still served
        logger.debug("queue figures not read for /metrics: %s", exc)
        return
    set_queue_gauges(metrics, stats, now)


def set_queue_gauges(metrics: Metrics, stats: Mapping[str, Any], now: float) -> None:
    """The queue gauges from ``stats`` (workflow -> ``QueueStat``) as of ``now``; the
    workflows not in it stop being reported."""
    for name, stat in stats.items():
        metrics.set(QUEUE_DEPTH, float(stat.depth), workflow=name)
        age = 0.0 if stat.oldest_at is None else max(0.0, now - stat.oldest_at)
        metrics.set(QUEUE_AGE, age, workflow=name)
    served = [{"workflow": name} for name in stats]
    metrics.forget(QUEUE_DEPTH, served)
    metrics.forget(QUEUE_AGE, served)


def merge(reports: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Combine families from several workers: counters and histograms summed sample by
    sample; gauges summed, but for those in :data:`GAUGE_MAX`, which take the largest."""
    merged: dict[str, Any] = {}
    for report in reports:
        for name, family in report.items():
            into = merged.setdefault(name, {"type": family["type"], "help": family["help"],
                                            "samples": {}})
            highest = family["type"] == "gauge" and name in GAUGE_MAX
            for sample_name, labels, value in family["samples"]:
                key = (sample_name, tuple(sorted(labels.items())))
                have = into["samples"].get(key)
                if have is None:
                    into["samples"][key] = float(value)
                else:
                    into["samples"][key] = max(have, value) if highest else have + value
    return {
        name: {"type": f["type"], "help": f["help"],
               "samples": [[n, dict(labels), v] for (n, labels), v in f["samples"].items()]}
        for name, f in merged.items()
    }


def render(families: dict[str, Any]) -> str:
    """Prometheus text of families in the :meth:`Metrics.samples` shape (imports
    ``prometheus_client`` on the first scrape, never on the way to a first run)."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.exposition import generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(families))
    return generate_latest(registry).decode()


class _Families:
    """A collector yielding families received as data (a fleet's sum of its children)."""

    def __init__(self, families: dict[str, Any]) -> None:
        self._families = families

    def collect(self) -> Iterable[Any]:
        from prometheus_client.metrics_core import Metric

        for name in sorted(self._families):
            family = self._families[name]
            metric = Metric(name, family["help"], family["type"])
            for sample_name, labels, value in family["samples"]:
                metric.add_sample(sample_name, labels, value)
            yield metric
