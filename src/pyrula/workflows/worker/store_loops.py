"""The loops a worker runs only for a store that has the ability: its clock, its shard
leases, its reconcile job (``pyrula.workflows.stores.capabilities``)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from pyrula.config.worker import WorkerOptions
from pyrula.metrics import Metrics
from pyrula.workflows.clock import StoreClock
from pyrula.workflows.stores.capabilities import Reconciling, ShardLeases

logger = logging.getLogger(__name__)

#: How often a worker on a store with a clock of its own reads it again (``StoreClock``).
CLOCK_SYNC_INTERVAL_S = 30.0


class ClockLoop:
    """Read the store's clock again: it is the one that counts, should it be stepped."""

    name = "clock"
    interval = CLOCK_SYNC_INTERVAL_S

    def __init__(self, clock: StoreClock) -> None:
        self._clock = clock
        #: The worker read the clock just before its loops started: not again at once.
        self._fresh = True

    async def tick(self, now: float) -> float | None:
        if self._fresh:
            self._fresh = False
        else:
            await self._clock.sync()
        return None


#: How soon a worker that holds none of a name's shards tries again, rather than after a
#: whole ``shard_lease_interval``: after an upgrade the new children start while the old
#: ones still hold every shard, and lease them as soon as the old ones release them.
SHARD_RETRY_S = 1.0


class ShardLeaseLoop:
    """Claim and renew this worker's shard leases (a sharded store): every
    ``shard_lease_interval``, or within ``SHARD_RETRY_S`` while it holds none of a name's
    shards (a worker holding none scans every shard of the name meanwhile)."""

    name = "shard_lease"

    def __init__(self, leases: ShardLeases, worker_id: str, names: Sequence[str],
                 options: WorkerOptions) -> None:
        self.interval = options.shard_lease_interval
        self._leases = leases
        self._worker_id = worker_id
        self._names = names
        self._options = options

    async def tick(self, now: float) -> float | None:
        await self._leases.shard_lease_tick(
            worker_id=self._worker_id, names=self._names, now=now, options=self._options
        )
        held = self._leases.shards_held(self._worker_id)
        if any(not held.get(name) for name in self._names):
            return min(SHARD_RETRY_S, self.interval)
        return None


class ReconcileLoop:
    """The store's periodic catch-up job (the archive's reconcile)."""

    name = "reconcile"

    def __init__(self, job: Reconciling, worker_id: str, names: Sequence[str],
                 options: WorkerOptions, metrics: Metrics) -> None:
        self.interval = options.reconcile_interval
        self._job = job
        self._worker_id = worker_id
        self._names = names
        self._options = options
        self._metrics = metrics

    async def tick(self, now: float) -> float | None:
        try:
            await self._job.reconcile_tick(
                worker_id=self._worker_id, names=self._names, now=now, options=self._options
            )
        finally:
            lag = self._job.reconcile_lag(now)
            if lag is not None:
                self._metrics.set("pyrula.workflows.archive.lag", lag)
        return None
