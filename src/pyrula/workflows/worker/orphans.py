"""The orphan loop: membership, stranded runs, and the requeue of runs whose worker died.

Each pass first tells the store which names this worker serves (``Membership``), then
looks for queued runs of names no live worker serves (stranded), then requeues the runs
whose lock expired (``run:requeued`` reason ``orphaned``), each charged a crash.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from pyrula.config.worker import WorkerOptions
from pyrula.metrics import Metrics
from pyrula.workflows.family import nudge_parents_of
from pyrula.workflows.records import PoisonPolicy, RunError
from pyrula.workflows.stores.base import Store
from pyrula.workflows.worker.runtime import Runtime

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Serving:
    """Who this worker is and what it serves, as its loops tell the store."""

    store: Store
    worker_id: str
    names: Sequence[str]
    options: WorkerOptions
    log: dict[str, str]


class Membership:
    """The worker's registration (live for 3 orphan scans) and its stranded-run policy."""

    def __init__(self, serving: Serving) -> None:
        self._s = serving
        self._stranded_logged: set[str] = set()

    async def tick(self, now: float) -> None:
        await self.register(now)
        await self.check_stranded(now)

    async def register(self, now: float) -> None:
        """Tell the store which names this worker serves (live for 3 orphan scans)."""
        s = self._s
        ttl = max(3 * s.options.orphan_scan_interval, 30.0)
        await s.store.register_worker(s.worker_id, s.names, now=now, ttl=ttl)

    async def check_stranded(self, now: float) -> None:
        """Queued runs of names no live worker serves: "wait" logs ``run_stranded`` once per
        name; "fail" ends those queued longer than ``stranded_timeout`` (code stranded)."""
        s, o = self._s, self._s.options
        for name in await s.store.stranded(now=now):
            if name not in self._stranded_logged:
                self._stranded_logged.add(name)
                logger.warning(
                    "run_stranded: runs of workflow %r are queued but no live worker serves "
                    "it (stranded_policy=%s)", name, o.stranded_policy,
                    extra={"event": "run_stranded", "workflow": name, **s.log},
                )
            if o.stranded_policy != "fail":
                continue
            timeout = o.stranded_timeout
            error = RunError(
                "stranded", "Stranded",
                f"no live worker served workflow {name!r} for {timeout:g} s "
                "(stranded_policy=fail)",
                {"stranded_timeout": timeout},
            )
            failed = await s.store.fail_stranded(
                name, older_than=now - timeout, now=now, limit=1000, error=error.as_dict()
            )
            if failed:
                await nudge_parents_of(s.store, failed, now=now)
                logger.error("run_stranded: %d runs of %r failed (stranded)", len(failed), name,
                             extra={"event": "run_stranded", "workflow": name, **s.log})

    async def leave(self) -> None:
        """Unregister (at shutdown; a registration not renewed lapses by itself)."""
        await self._s.store.unregister_worker(self._s.worker_id)


class OrphanLoop:
    name = "orphan"

    def __init__(self, serving: Serving, poison: PoisonPolicy, runtime: Runtime,
                 metrics: Metrics) -> None:
        self.interval = serving.options.orphan_scan_interval
        self.membership = Membership(serving)
        self._s = serving
        self._poison = poison
        self._rt = runtime
        self._metrics = metrics
        #: Since when the store has answered this loop after an outage it saw (None: it is
        #: out, or was a moment ago); -inf: no outage seen.
        self._answering_since: float | None = float("-inf")
        #: The worker's last failed store call this loop has taken into account.
        self._failure_seen = float("-inf")

    async def tick(self, now: float) -> float | None:
        s = self._s
        # The store was out for this worker (a call failed since this loop last looked, or
        # a moment ago), so it was for the others: the locks that lapsed meanwhile are those
        # of workers that could not renew, not of dead ones. They get one lock_ttl to renew
        # or put their runs back themselves (reason store_unavailable) before a reclaim
        # would charge each run a crash, counted from when this loop finds the store
        # answering again: its own last failure may be older than the outage's end (its
        # calls backed off), and its first tick after it may be the first that answers.
        failed = self._rt.last_store_failure()
        if failed != self._failure_seen:
            self._failure_seen = failed
            self._answering_since = None
        await self.membership.tick(now)
        if self._rt.store_failed_within(s.options.lock_ttl):
            self._answering_since = None
            return None
        mono = time.monotonic()
        if self._answering_since is None:
            self._answering_since = mono
        if mono - self._answering_since < s.options.lock_ttl:
            return None
        outcomes = await s.store.reclaim(s.names, now=now, limit=1000, poison=self._poison)
        for outcome in outcomes:
            if outcome.quarantined:
                logger.error(
                    "run_quarantined: run %s crashed its workers more than %d times",
                    outcome.run_id, s.options.poison_max_retries,
                    extra={"event": "run_quarantined", "run_id": outcome.run_id, **s.log},
                )
            else:
                logger.warning(
                    "run_reclaimed: run %s was orphaned (its worker's lock expired); requeued",
                    outcome.run_id,
                    extra={"event": "run_reclaimed", "run_id": outcome.run_id, **s.log},
                )
        await nudge_parents_of(s.store, [o.run_id for o in outcomes if o.quarantined],
                               now=now)
        if outcomes:
            self._metrics.inc("pyrula.workflows.runs.reclaimed", len(outcomes))
            requeued = sum(1 for outcome in outcomes if not outcome.quarantined)
            if requeued:
                self._metrics.inc("pyrula.workflows.runs.requeued", requeued, reason="orphaned")
        return None
