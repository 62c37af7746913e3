"""Recover a dead child's work at once, through the store: requeue the runs it held (a
crash counted, with the evidence, against those that could have caused it) and release its
shard leases."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection
from typing import Any, TypeVar

from pyrula.backoff import backoff_delays
from pyrula.errors import StoreUnavailable
from pyrula.logs import FLEET_LOGGER
from pyrula.workflows.clock import store_clock
from pyrula.workflows.records import RequeueOutcome
from pyrula.workflows.stores.capabilities import capabilities_of

logger = logging.getLogger(FLEET_LOGGER)

T = TypeVar("T")


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


#: A recovery the store refused is tried again after a jittered delay doubling from
#: ``RETRY_MIN`` to ``RETRY_MAX`` seconds, so it lands soon after the store answers again.
RETRY_MIN = 0.25
RETRY_MAX = 2.0


class Recovery:
    def __init__(self, store: Any, poison_max_retries: int, poison_retry_ttl_s: float,
                 retry_for: float = 0.0) -> None:
        self.store = store
        self.max_retries = poison_max_retries
        self.retry_ttl_s = poison_retry_ttl_s
        #: How long a recovery the store refused (it was down as the child died) is tried
        #: again: until the dead worker's locks and shard leases would have lapsed, after
        #: which the orphan scan and the other workers' lease ticks find its runs anyway.
        #: Without the retry, the runs would wait for those lapses although the supervisor
        #: knows the worker is dead.
        self.retry_for = retry_for
        # The clock the children judge crashes and locks by (the store's, where it has one).
        self._clock = store_clock(store)
        self._shard_leases = capabilities_of(store).shard_leases

    async def child_died(
        self, worker_id: str, held: dict[str, int], evidence: dict[str, Any],
        user_code: Collection[str] | None = None, suspects: Collection[str] = (),
        keep_trying: Callable[[], bool] = lambda: True,
    ) -> tuple[int, int, int]:
        """Requeue every run the dead worker's lock still holds — found by the store, so a
        run claimed in the instant before the kill is not missed — and release its shards.
        A crash is counted only against the runs ``runs_to_charge`` names from the child's
        last report (``user_code``, ``suspects``); the others go back without one.
        ``held`` (what its last heartbeat reported) is only used for the log.
        Returns (requeued, quarantined, charged a crash: the quarantined among them).

        A store that cannot be reached is tried again for ``retry_for`` seconds while
        ``keep_trying()`` (the fleet is not draining); past that the runs are left to the
        orphan scan (which charges each of them) and the shards to their leases' lapse."""
        charge = runs_to_charge(user_code, suspects)
        gives_up_at = time.monotonic() + self.retry_for
        try:
            outcomes, now = await self._until_answered(
                lambda: self._reclaim(worker_id, evidence, charge),
                f"requeue the runs of dead child {worker_id}", gives_up_at, keep_trying)
        except StoreUnavailable as exc:
            logger.warning("could not requeue the runs of dead child %s (%s, it held %d); the "
                           "orphan scan will", worker_id, exc, len(held))
            outcomes, now = [], 0.0
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
        await self._release(worker_id, gives_up_at, keep_trying)
        return len(outcomes) - len(quarantined), len(quarantined), charged

    async def child_drained(self, worker_id: str,
                            keep_trying: Callable[[], bool] = lambda: True) -> None:
        """Release the shards of a child that drained. Its own shutdown released them,
        unless the store was down then: without this its replacement would wait for them
        to lapse (``shard_lease_ttl``). A release of nothing is a no-op."""
        await self._release(worker_id, time.monotonic() + self.retry_for, keep_trying)

    async def _release(self, worker_id: str, gives_up_at: float,
                       keep_trying: Callable[[], bool]) -> None:
        leases = self._shard_leases
        if leases is None:
            return
        try:
            await self._until_answered(lambda: leases.release_shards(worker_id),
                                       f"release the shards of {worker_id}", gives_up_at,
                                       keep_trying)
        except StoreUnavailable as exc:
            logger.warning("could not release shards of %s (%s)", worker_id, exc)

    async def _reclaim(self, worker_id: str, evidence: dict[str, Any],
                       charge: frozenset[str] | None) -> tuple[list[RequeueOutcome], float]:
        """One try at requeueing the dead worker's runs: (outcomes, the store's now)."""
        from pyrula.workflows.records import PoisonPolicy

        if self._clock is not None:
            await self._clock.sync()
        now = self._clock.now() if self._clock is not None else time.time()
        outcomes = await self.store.reclaim_worker(
            worker_id, now=now, poison=PoisonPolicy(self.max_retries, self.retry_ttl_s),
            crash_detail={"cause": "worker_crash", **evidence}, charge=charge,
        )
        return outcomes, now

    async def _until_answered(self, call: Callable[[], Awaitable[T]], what: str,
                              gives_up_at: float, keep_trying: Callable[[], bool]) -> T:
        """``call()``, tried again on StoreUnavailable until it answers, ``keep_trying()``
        turns False or ``gives_up_at`` (monotonic) would pass: then its error is raised."""
        delays = backoff_delays(RETRY_MIN, RETRY_MAX)
        first = True
        while True:
            try:
                return await call()
            except StoreUnavailable as exc:
                delay = delays()
                left = gives_up_at - time.monotonic()
                if not keep_trying() or delay > left:
                    raise
                if first:
                    logger.warning("could not %s yet (%s); trying again until the store "
                                   "answers, for up to %.1f s", what, exc, left)
            first = False
            await asyncio.sleep(delay)
