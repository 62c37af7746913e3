"""Recover a dead child's work at once, through the store: requeue the runs it held (a
crash counted against each, with the evidence) and release its shard leases."""

from __future__ import annotations

import logging
import time
from typing import Any

from pyrula.errors import StoreUnavailable
from pyrula.workflows.clock import store_clock

logger = logging.getLogger("pyrula.fleet")


class Recovery:
    def __init__(self, store: Any, poison_max_retries: int, poison_retry_ttl_s: float) -> None:
        self.store = store
        self.max_retries = poison_max_retries
        self.retry_ttl_s = poison_retry_ttl_s
        # The clock the children judge crashes and locks by (the store's, where it has one).
        self._clock = store_clock(store)

    async def child_died(
        self, worker_id: str, held: dict[str, int], evidence: dict[str, Any]
    ) -> tuple[int, int]:
        """Requeue every run the dead worker's lock still holds — found by the store, so a
        run claimed in the instant before the kill is not missed — and release its shards.
        ``held`` (what its last heartbeat reported) is only used for the log.
        Returns (requeued, quarantined); a store that cannot be reached leaves the runs to
        the orphan scan."""
        from pyrula.workflows.records import PoisonPolicy

        poison = PoisonPolicy(self.max_retries, self.retry_ttl_s)
        try:
            if self._clock is not None:
                await self._clock.sync()
            now = self._clock.now() if self._clock is not None else time.time()
            outcomes = await self.store.reclaim_worker(
                worker_id, now=now, poison=poison,
                crash_detail={"cause": "worker_crash", **evidence},
            )
        except StoreUnavailable as exc:
            logger.warning("could not requeue the runs of dead child %s (%s, it held %d); the "
                           "orphan scan will", worker_id, exc, len(held))
            outcomes = []
        quarantined = [o for o in outcomes if o.quarantined]
        for outcome in quarantined:
            logger.error(
                "run_quarantined: run %s crashed its worker more than %d times (last: %s)",
                outcome.run_id, self.max_retries, evidence.get("exit"),
                extra={"event": "run_quarantined", "run_id": outcome.run_id, **evidence},
            )
        release = getattr(self.store, "release_shards", None)
        if release is not None:
            try:
                await release(worker_id)
            except StoreUnavailable as exc:
                logger.warning("could not release shards of %s (%s)", worker_id, exc)
        return len(outcomes) - len(quarantined), len(quarantined)
