"""Recover a dead child's work at once, through the store: requeue the runs it held (a
crash counted, with the evidence, against those that could have caused it) and release its
shard leases."""

from __future__ import annotations

import logging
import time
from collections.abc import Collection
from typing import Any

from pyrula.errors import StoreUnavailable
from pyrula.logs import FLEET_LOGGER
from pyrula.workflows.clock import store_clock
from pyrula.workflows.stores.capabilities import capabilities_of

logger = logging.getLogger(FLEET_LOGGER)


def runs_to_charge(user_code: Collection[str] | None,
                   suspects: Collection[str]) -> frozenset[str] | None:
    """Which of a dead child's runs its crash is counted against, from its last report:
    ``user_code``, the runs that may have been inside their own code, and ``suspects``,
    the runs it held with a crash counted already.

    A suspect in user code is charged alone: suspects run one at a time per child, so the
    one in its code is the culprit if any suspect is, and a run that was charged once for
    sharing a child with a culprit is not charged again for that culprit's next crash.
    Without one, every run in user code is charged (a first crash names no culprit yet,
    and the culprit must be among them). None (a child that reports no ``user_code``)
    charges every run it held.
    """
    if user_code is None:
        return None
    in_code = frozenset(user_code)
    return (in_code & frozenset(suspects)) or in_code


class Recovery:
    def __init__(self, store: Any, poison_max_retries: int, poison_retry_ttl_s: float) -> None:
        self.store = store
        self.max_retries = poison_max_retries
        self.retry_ttl_s = poison_retry_ttl_s
        # The clock the children judge crashes and locks by (the store's, where it has one).
        self._clock = store_clock(store)
        self._shard_leases = capabilities_of(store).shard_leases

    async def child_died(
        self, worker_id: str, held: dict[str, int], evidence: dict[str, Any],
        user_code: Collection[str] | None = None, suspects: Collection[str] = (),
    ) -> tuple[int, int, int]:
        """Requeue every run the dead worker's lock still holds — found by the store, so a
        run claimed in the instant before the kill is not missed — and release its shards.
        A crash is counted only against the runs ``runs_to_charge`` names from the child's
        last report (``user_code``, ``suspects``); the others go back without one.
        ``held`` (what its last heartbeat reported) is only used for the log.
        Returns (requeued, quarantined, charged a crash: the quarantined among them); a
        store that cannot be reached leaves the runs to the orphan scan (which charges each
        of them)."""
        from pyrula.workflows.records import PoisonPolicy

        poison = PoisonPolicy(self.max_retries, self.retry_ttl_s)
        charge = runs_to_charge(user_code, suspects)
        try:
            if self._clock is not None:
                await self._clock.sync()
            now = self._clock.now() if self._clock is not None else time.time()
            outcomes = await self.store.reclaim_worker(
                worker_id, now=now, poison=poison,
                crash_detail={"cause": "worker_crash", **evidence}, charge=charge,
            )
        except StoreUnavailable as exc:
            logger.warning("could not requeue the runs of dead child %s (%s, it held %d); the "
                           "orphan scan will", worker_id, exc, len(held))
            outcomes = []
        quarantined = [o for o in outcomes if o.quarantined]
        if quarantined:
            from pyrula.workflows.family import nudge_parents_of

            await nudge_parents_of(self.store, [o.run_id for o in quarantined], now=now)
        charged = sum(1 for o in outcomes if charge is None or o.run_id in charge)
        for outcome in quarantined:
            logger.error(
                "run_quarantined: run %s crashed its worker more than %d times (last: %s)",
                outcome.run_id, self.max_retries, evidence.get("exit"),
                extra={"event": "run_quarantined", "run_id": outcome.run_id, **evidence},
            )
        leases = self._shard_leases
        if leases is not None:
            try:
                await leases.release_shards(worker_id)
            except StoreUnavailable as exc:
                logger.warning("could not release shards of %s (%s)", worker_id, exc)
        return len(outcomes) - len(quarantined), len(quarantined), charged
