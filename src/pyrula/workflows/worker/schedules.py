"""The schedule loop: every ``schedule_interval``, fire the due schedules of the served names
(not while the worker drains or is bound to another project).

For each due schedule (``plan`` in pyrula.workflows.schedules.policy decides the rest):

1. Past its ``catchup_window``: not fired (``schedule_skipped_catchup``).
2. ``overlap="skip"`` and its last run unfinished (a ``continue_as_new`` chain counts as
   one run): not fired (``schedule_skipped_overlap``).
3. Otherwise submitted with idempotency key ``schedule:{id}:{epoch}``.

Then ``next_run_at`` moves to the first occurrence after now by compare-and-set. The run
is submitted *before* that move: a worker that dies between the two leaves the schedule
due, and the next pass submits the same key again, which returns the same run. Two workers
passing over one occurrence submit one run (the key) and move the schedule once (the
compare-and-set); only the one whose move won logs a skip, so each is logged once.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from pyrula.metrics import Metrics
from pyrula.timestamps import iso_utc
from pyrula.workflows.schedules.policy import plan
from pyrula.workflows.schedules.schedule import Schedule, epoch
from pyrula.workflows.stores.base import Store
from pyrula.workflows.worker.loops import TRANSIENT
from pyrula.workflows.worker.runtime import Runtime

logger = logging.getLogger(__name__)

#: Schedules fired per pass; a full batch is followed by another pass at once.
BATCH = 100
#: How far a ``continue_as_new`` chain is followed to find the run still going.
MAX_CHAIN = 100

SKIPPED = "pyrula.workflows.schedules.skipped"
FIRED = "pyrula.workflows.schedules.fired"


class ScheduleLoop:
    """Fires the due schedules of ``names`` in ``store``; ``tick`` is one pass. With a
    ``runtime``, a pass while it is paused fires nothing."""

    name = "schedule"

    def __init__(
        self,
        store: Store,
        names: Sequence[str],
        metrics: Metrics,
        log: dict[str, str],
        *,
        interval: float,
        runtime: Runtime | None = None,
    ) -> None:
        self.interval = interval
        self._store = store
        self._names = list(names)
        self._metrics = metrics
        self._log = log
        self._rt = runtime

    async def tick(self, now: float) -> float | None:
        if self._rt is not None and self._rt.paused:
            return None
        due = await self._store.schedules_due(self._names, now=now, limit=BATCH)
        handled = 0
        for sched in due:
            try:
                await self._fire(sched, now)
            except TRANSIENT:
                raise  # the loop restarts with backoff; the schedule is still due
            except Exception:  # one broken schedule must not stop the others
                logger.exception(
                    "schedule_failed: schedule %r could not be fired", sched.schedule_id,
                    extra={"event": "schedule_failed", **self._extra(sched)},
                )
            else:
                handled += 1
        # A full batch means more may be due: go again at once, unless nothing in it could
        # be handled (a batch of broken schedules would otherwise spin).
        return 0.0 if len(due) >= BATCH and handled else None

    async def _fire(self, sched: Schedule, now: float) -> None:
        decision = plan(sched, now)
        expected = epoch(sched.next_run_at)
        occurrence = iso_utc(decision.occurrence)
        extra = {**self._extra(sched), "occurrence": occurrence}
        if not decision.in_window:
            if await self._advance(sched, expected, decision.next_run_at):
                self._metrics.inc(SKIPPED, reason="catchup_window")
                logger.warning(
                    "schedule_skipped_catchup: schedule %r missed its occurrence at %s by "
                    "%.0f s, more than its catchup_window (%.0f s); next at %s",
                    sched.schedule_id, occurrence, now - decision.occurrence,
                    sched.catchup_window.total_seconds() if sched.catchup_window else 0.0,
                    iso_utc(decision.next_run_at),
                    extra={"event": "schedule_skipped_catchup", **extra},
                )
            return
        if sched.overlap == "skip":
            running = await self._unfinished(sched.last_run_id)
            if running is not None:
                if await self._advance(sched, expected, decision.next_run_at):
                    self._metrics.inc(SKIPPED, reason="overlap")
                    logger.info(
                        "schedule_skipped_overlap: schedule %r did not fire at %s: its "
                        "previous run %s is still %s (overlap=skip)",
                        sched.schedule_id, occurrence, running[0], running[1],
                        extra={"event": "schedule_skipped_overlap", "run_id": running[0],
                               **extra},
                    )
                return
        handle, created = await self._store.submit(
            sched.name, sched.params, now=now, idempotency_key=decision.key
        )
        moved = await self._store.schedule_advance(
            sched.schedule_id, expected_next_run_at=expected,
            next_run_at=decision.next_run_at, run_id=handle.run_id, run_at=now,
        )
        if created:
            self._metrics.inc(FIRED)
        if moved:
            logger.info(
                "schedule_fired: schedule %r submitted run %s for its occurrence at %s",
                sched.schedule_id, handle.run_id, occurrence,
                extra={"event": "schedule_fired", "run_id": handle.run_id, **extra},
            )

    async def _advance(self, sched: Schedule, expected: int, following: int) -> bool:
        return await self._store.schedule_advance(
            sched.schedule_id, expected_next_run_at=expected, next_run_at=following,
        )

    async def _unfinished(self, run_id: str | None) -> tuple[str, str] | None:
        """(run id, status) of the run still going on for ``run_id``'s chain, if any."""
        for _ in range(MAX_CHAIN):
            if run_id is None:
                return None
            info = await self._store.get_run(run_id)
            if info is None:  # expired from the store: long finished
                return None
            if not info.status.terminal:
                return run_id, info.status.value
            run_id = info.successor_id
        return None

    def _extra(self, sched: Schedule) -> dict[str, Any]:
        return {"schedule_id": sched.schedule_id, "workflow": sched.name, **self._log}
