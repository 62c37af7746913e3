"""Recover a dead child's work at once, through the store: requeue the runs it held (a
crash counted against each, with the evidence) and release its shard leases."""

from __future__ import annotations

import logging
import time
from typing import Any

from pyrula.errors import StaleToken, StoreUnavailable, WorkflowNotFound

logger = logging.getLogger("pyrula.fleet")


class Recovery:
    def __init__(self, store: Any, poison_max_retries: int, poison_retry_ttl_s: float) -> None:
        self.store = store
        self.max_retries = poison_max_retries
        self.retry_ttl_s = poison_retry_ttl_s

    async def child_died(
        self, worker_id: str, held: dict[str, int], evidence: dict[str, Any]
    ) -> tuple[int, int]:
        """Requeue ``held`` runs (run id -> token) and release the worker's shards.
        Returns (requeued, quarantined). A run another attempt already owns is left
        alone (its token is stale); a run we could not reach is left to orphan recovery."""
        from pyrula.workflows.records import PoisonPolicy

        poison = PoisonPolicy(self.max_retries, self.retry_ttl_s)
        requeued = quarantined = 0
        for run_id, token in held.items():
            detail = {"cause": "worker_crash", "worker": worker_id, "attempt": token,
                      **evidence}
            try:
                outcome = await self.store.requeue(
                    run_id, token, now=time.time(), reason="orphaned", crash=True,
                    poison=poison, crash_detail=detail,
                )
            except (StaleToken, WorkflowNotFound):
                continue
            except StoreUnavailable as exc:
                logger.warning("could not requeue run %s of dead child %s (%s); the orphan "
                               "scan will", run_id, worker_id, exc)
                continue
            if outcome.quarantined:
                quarantined += 1
                logger.error(
                    "run_quarantined: run %s crashed its worker more than %d times "
                    "(last: %s)", run_id, self.max_retries, evidence.get("exit"),
                    extra={"event": "run_quarantined", "run_id": run_id, **evidence},
                )
            else:
                requeued += 1
        release = getattr(self.store, "release_shards", None)
        if release is not None:
            try:
                await release(worker_id)
            except StoreUnavailable as exc:
                logger.warning("could not release shards of %s (%s)", worker_id, exc)
        return requeued, quarantined
