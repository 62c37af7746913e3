"""An attempt's writes in the memory store, each fenced by its token, and the requeues of
attempts whose worker died or lost the store (reclaim, reclaim_worker, requeue_unheld)."""

from __future__ import annotations

import heapq
import logging
import time
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from pyrula.workflows.events import (
    CHILD_SIGNAL,
    INTERRUPT_SIGNAL,
    Event,
    EventType,
    make_event,
    stamp_successor,
)
from pyrula.workflows.records import (
    AppendResult,
    FinishResult,
    ParkResult,
    PoisonPolicy,
    RenewResult,
    RequeueOutcome,
    RunStatus,
)
from pyrula.workflows.stores.common import (
    error_event,
    live_crashes,
    new_run_id,
    quarantine_error,
    requeued_event,
    submitted_event,
)
from pyrula.workflows.stores.memory.state import MemoryState, RunRecord, json_copy

logger = logging.getLogger(__name__)

#: No limit on the runs one ``recover_pending_runs`` requeues.
_ALL = 1 << 30


class MemoryAttempts:
    """What the attempt holding a run writes (append, park, finish, requeue, renew) and
    the requeue of attempts no live worker holds any more."""

    def __init__(self, state: MemoryState) -> None:
        self._state = state

    async def append(
        self, run_id: str, token: int, events: Sequence[Event], *, now: float, lock_ttl: float
    ) -> AppendResult:
        with self._state.lock:
            run = self._state.fenced(run_id, token)
            last = run.append(events, now)
            run.lock_expires = now + lock_ttl
            return AppendResult(last, run.cancel_requested)

    async def park(
        self,
        run_id: str,
        token: int,
        events: Sequence[Event],
        *,
        now: float,
        wake_at: float | None,
        signals: Sequence[str],
        known_seq: int,
        interrupt: Any = None,
    ) -> ParkResult:
        with self._state.lock:
            run = self._state.fenced(run_id, token)
            last = run.append(events, now)
            arrived = any(run.signal_seq.get(s, 0) > known_seq for s in signals)
            arrived = arrived or (run.nudged and CHILD_SIGNAL in signals)
            run.nudged = False
            if arrived or run.cancel_requested:
                return ParkResult(False, last, run.tail(known_seq), run.cancel_requested)
            run.lock_owner = None
            run.suspect = False  # an attempt that parks has completed
            run.parked_seq = last
            run.status = RunStatus.WAITING if signals else RunStatus.SLEEPING
            run.waiting_for = tuple(signals)
            run.interrupt = json_copy(interrupt) if INTERRUPT_SIGNAL in signals else None
            run.wake_at = wake_at
            if wake_at is not None:
                heapq.heappush(self._state.timers, (wake_at, run.run_id))
            return ParkResult(True, last)

    async def finish(
        self,
        run_id: str,
        token: int,
        events: Sequence[Event],
        *,
        now: float,
        status: RunStatus,
        result: Any = None,
        error: dict[str, Any] | None = None,
        successor_params: Any = None,
    ) -> FinishResult:
        status = RunStatus(status)
        state = self._state
        with state.lock:
            run = state.fenced(run_id, token)
            events = [dict(e) for e in events]
            successor_id = None
            if status is RunStatus.CONTINUED:
                # Stamped before the successor is stored, so a finish refused for a missing
                # run:continued event leaves no successor behind.
                successor_id = new_run_id(now)
                stamp_successor(events, successor_id)
                successor = state.new_run(
                    successor_id, run.name, successor_params, run.owner, now,
                    start_id=run.start_id, priority=run.priority,
                )
                successor.append(
                    [submitted_event(now, run.name, successor_params, run.owner or None, None)],
                    now,
                )
                successor.journal[0]["predecessor"] = run.run_id
                run.successor_id = successor_id
            last = run.append(events, now)
            state.end(run, status, now, result=result, error=error)
            return FinishResult(last, successor_id)

    async def requeue(
        self,
        run_id: str,
        token: int,
        *,
        now: float,
        reason: str,
        events: Sequence[Event] = (),
        crash: bool = False,
        poison: PoisonPolicy | None = None,
        crash_detail: Mapping[str, Any] | None = None,
    ) -> RequeueOutcome:
        with self._state.lock:
            run = self._state.fenced(run_id, token)
            run.append(events, now)
            return self._requeue(run, now, reason, crash, poison, crash_detail)

    async def renew(
        self, worker_id: str, held: Mapping[str, int], *, now: float, lock_ttl: float
    ) -> RenewResult:
        lost: set[str] = set()
        cancel: set[str] = set()
        with self._state.lock:
            for run_id, token in held.items():
                run = self._state.runs.get(run_id)
                if run is None or run.status is not RunStatus.RUNNING or run.attempt != token:
                    lost.add(run_id)
                    continue
                run.lock_expires = now + lock_ttl
                if run.cancel_requested:
                    cancel.add(run_id)
        return RenewResult(frozenset(lost), frozenset(cancel))

    async def reclaim(
        self,
        names: Sequence[str] | None,
        *,
        now: float,
        limit: int,
        poison: PoisonPolicy,
    ) -> list[RequeueOutcome]:
        with self._state.lock:
            return self._reclaim(names, now, limit, poison)

    async def reclaim_worker(
        self,
        worker_id: str,
        *,
        now: float,
        poison: PoisonPolicy,
        crash_detail: Mapping[str, Any] | None = None,
        charge: Collection[str] | None = None,
    ) -> list[RequeueOutcome]:
        charged = None if charge is None else set(charge)
        with self._state.lock:
            out = []
            for run in list(self._state.runs.values()):
                if run.status is RunStatus.RUNNING and run.lock_owner == worker_id:
                    crash = charged is None or run.run_id in charged
                    detail = {"cause": "worker_crash", "worker": worker_id,
                              "attempt": run.attempt, **dict(crash_detail or {})}
                    out.append(self._requeue(run, now, "orphaned", crash, poison, detail))
            return out

    async def requeue_unheld(
        self, worker_id: str, held: Collection[str], *, now: float
    ) -> list[RequeueOutcome]:
        with self._state.lock:
            return [
                self._requeue(run, now, "store_unavailable", False, None, None)
                for run in list(self._state.runs.values())
                if run.status is RunStatus.RUNNING and run.lock_owner == worker_id
                and run.run_id not in held
            ]

    async def arecover_pending_runs(self, name: str) -> int:
        with self._state.lock:
            return len(self._reclaim([name], time.time(), _ALL, PoisonPolicy()))

    def _reclaim(
        self, names: Sequence[str] | None, now: float, limit: int, poison: PoisonPolicy
    ) -> list[RequeueOutcome]:
        """Requeue up to ``limit`` running runs (of ``names``; None: any) whose lock expired,
        counting a crash against each."""
        wanted = None if names is None else set(names)
        out: list[RequeueOutcome] = []
        for run in list(self._state.runs.values()):
            if len(out) >= limit:
                break
            if run.status is not RunStatus.RUNNING or run.lock_expires > now:
                continue
            if wanted is not None and run.name not in wanted:
                continue
            detail = {"cause": "worker_crash", "worker": run.lock_owner, "attempt": run.attempt}
            out.append(self._requeue(run, now, "orphaned", True, poison, detail))
        return out

    def _requeue(
        self,
        run: RunRecord,
        now: float,
        reason: str,
        crash: bool,
        poison: PoisonPolicy | None,
        crash_detail: Mapping[str, Any] | None,
    ) -> RequeueOutcome:
        """Put ``run`` back in its queue; or end it: failed (quarantined) if this crash is
        one more than ``poison`` allows, cancelled if a cancel was requested. A run charged
        a crash becomes a suspect, queued apart until an attempt of it parks or ends."""
        counted = None
        if crash:
            policy = poison or PoisonPolicy()
            run.crashes = live_crashes(run.crashes, now, policy.retry_ttl_s) + [now]
            counted = len(run.crashes)
            if counted > policy.max_retries:
                error = quarantine_error(counted, crash_detail)
                run.append([error_event(now, error)], now)
                self._state.end(run, RunStatus.FAILED, now, error=error)
                return RequeueOutcome(run.run_id, True)
            run.suspect = True
        if run.cancel_requested:
            run.append([make_event(EventType.RUN_CANCELLED, now)], now)
            self._state.end(run, RunStatus.CANCELLED, now)
            return RequeueOutcome(run.run_id, False)
        run.append([requeued_event(now, reason, counted, crash_detail)], now)
        self._state.enqueue(run, now)
        return RequeueOutcome(run.run_id, False)
