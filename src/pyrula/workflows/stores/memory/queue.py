"""The memory store's work queue: submit, claim (deficit round robin over owners, within
one its highest priority first, FIFO within a priority, flow control), claim one
put-aside suspect, claim one run by id, wake runs whose timer is due, and the queues'
depth and age (QueueStats)."""

from __future__ import annotations

import heapq
import logging
from collections.abc import Sequence
from typing import Any

from pyrula.workflows.events import EventType, make_event
from pyrula.workflows.limits import LimitKeys
from pyrula.workflows.priority import check_priority
from pyrula.workflows.records import Claimed, ClaimedRun, RunHandle, RunStatus, SuspectsAt
from pyrula.workflows.stores.capabilities import QueueStat
from pyrula.workflows.stores.common import (
    NO_OWNER,
    new_run_id,
    pick_owner,
    started_event,
    submitted_event,
)
from pyrula.workflows.stores.memory.flow import MemoryFlowControl
from pyrula.workflows.stores.memory.limits import MemoryLimits
from pyrula.workflows.stores.memory.state import MemoryState, RunRecord, json_copy

logger = logging.getLogger(__name__)


class MemoryQueue:
    """Runs enter their queue here and leave it to a worker (or a timer brings them back)."""

    def __init__(
        self, state: MemoryState, flow: MemoryFlowControl, limits: MemoryLimits
    ) -> None:
        self._state = state
        self._flow = flow
        self._limits = limits

    async def submit(
        self,
        name: str,
        params: Any,
        *,
        now: float,
        owner: str | None = None,
        idempotency_key: str | None = None,
        priority: int = 0,
        limit_keys: LimitKeys | None = None,
    ) -> tuple[RunHandle, bool]:
        """Atomic (under the state's lock): the idempotency check, the new run, its
        place in its owner's queue by ``priority`` (or, with ``limit_keys``, in its key's
        waiting line)."""
        priority = check_priority(priority)
        state = self._state
        with state.lock:
            if idempotency_key is not None:
                existing = state.idempotency.get((name, idempotency_key))
                if existing is not None:
                    return RunHandle(name, existing), False
            run = state.new_run(
                new_run_id(now), name, params, owner or NO_OWNER, now,
                idempotency_key=idempotency_key, priority=priority, limit_keys=limit_keys,
            )
            run.append([submitted_event(now, name, params, owner, idempotency_key)], now)
            if idempotency_key is not None:
                state.idempotency[(name, idempotency_key)] = run.run_id
            return RunHandle(name, run.run_id), True

    async def claim(
        self,
        worker_id: str,
        names: Sequence[str],
        *,
        limit: int,
        now: float,
        lock_ttl: float,
        build: str | None = None,
    ) -> Claimed:
        claimed: list[ClaimedRun] = []
        with self._state.lock:
            # Suspects are never in the owners' queues (MemoryState.enqueue): say where
            # they wait.
            waiting = [SuspectsAt(n) for n in names if self._state.suspects.get(n)]
            self._limits.admit(names, now)
            blocked: set[str] = set()
            progress = True
            while len(claimed) < limit and progress:
                progress = False
                for name in names:
                    if len(claimed) >= limit:
                        break
                    run = self._pick(name, now, blocked)
                    if run is None:
                        continue
                    progress = True
                    claimed.append(self._take(run, worker_id, now, lock_ttl, build))
        return Claimed(claimed, waiting)

    async def claim_suspect(
        self,
        worker_id: str,
        at: Sequence[SuspectsAt],
        *,
        now: float,
        lock_ttl: float,
        build: str | None = None,
    ) -> ClaimedRun | None:
        state = self._state
        with state.lock:
            for place in at:
                waiting = [state.runs[r] for r in state.suspects.get(place.name, ())]
                # The most crashes first, then the longest-waiting (sorted() is stable).
                for run in sorted(waiting, key=lambda r: -len(r.crashes)):
                    if self._flow.allows(run.owner, now) and self._limits.room(run, now):
                        state.dequeue(run)
                        return self._take(run, worker_id, now, lock_ttl, build)
        return None

    async def claim_run(
        self, run_id: str, worker_id: str, *, now: float, lock_ttl: float,
        build: str | None = None,
    ) -> ClaimedRun | None:
        with self._state.lock:
            run = self._state.runs.get(run_id)
            if run is None or run.status is not RunStatus.QUEUED:
                return None
            if (run.held or run.suspect) and not self._limits.room(run, now):
                return None  # its key is at its limit: it waits in its line
            self._state.dequeue(run)
            return self._take(run, worker_id, now, lock_ttl, build)

    async def wake_due(self, *, now: float, limit: int) -> int:
        state = self._state
        woken = 0
        with state.lock:
            while state.timers and woken < limit and state.timers[0][0] <= now:
                wake_at, run_id = heapq.heappop(state.timers)
                run = state.runs.get(run_id)
                if run is None or run.wake_at != wake_at:
                    continue  # stale timer entry: the run was woken or re-parked since
                if run.status not in (RunStatus.SLEEPING, RunStatus.WAITING):
                    continue
                run.append([make_event(EventType.RUN_WOKEN, now, reason="timer")], now)
                state.enqueue(run, now)
                woken += 1
        return woken

    async def queue_stats(self, names: Sequence[str]) -> dict[str, QueueStat]:
        """Every queued run of each name counts, whether or not flow control would let
        its owner start one now: those wait as much as the others."""
        stats: dict[str, QueueStat] = {}
        with self._state.lock:
            for name in names:
                queued = [self._state.runs[r].queued_at for r in self._state.queued(name)]
                stats[name] = QueueStat(len(queued), min(queued) if queued else None)
        return stats

    def _take(
        self, run: RunRecord, worker_id: str, now: float, lock_ttl: float, build: str | None
    ) -> ClaimedRun:
        """Start the next attempt of ``run`` (already out of its queue) under ``worker_id``."""
        run.attempt += 1
        run.status = RunStatus.RUNNING
        run.lock_owner = worker_id
        run.lock_expires = now + lock_ttl
        if run.started_at is None:
            run.started_at = now
        run.append([started_event(now, run.attempt, worker_id, build, run.idempotency_key)],
                   now)
        return ClaimedRun(
            run_id=run.run_id,
            name=run.name,
            params=json_copy(run.params),
            owner=run.owner or None,
            token=run.attempt,
            journal=run.tail(run.parked_seq),
            base_seq=run.parked_seq,
            start_id=run.start_id,
            created_at=run.created_at,
            crashes=tuple(run.crashes),
            suspect=run.suspect,
            limit_keys=run.limit_keys,
        )

    def _pick(self, name: str, now: float, blocked: set[str]) -> RunRecord | None:
        """Pop the next run of ``name``: from the least-served owner that flow control lets
        start one now. An owner refused is added to ``blocked`` for the rest of the claim."""
        owners = self._state.queues.get(name)
        if not owners:
            return None
        served = self._state.served.setdefault(name, {})
        candidates: dict[str, tuple[float, float]] = {}
        for tenant, queue in owners.items():
            if queue and tenant not in blocked:
                head = self._state.runs[queue[0]]
                candidates[tenant] = (served.get(tenant, 0.0), head.created_at)
        while candidates:
            owner = pick_owner(candidates)
            if owner is None:
                break
            if self._flow.allows(owner, now):
                served[owner] = served.get(owner, 0.0) + 1.0
                return self._state.runs[owners[owner].popleft()]
            blocked.add(owner)
            del candidates[owner]
        return None
