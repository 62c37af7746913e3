"""MemoryStore: the reference implementation of the Store protocol, in one process.

Every method runs under one lock, so each is atomic and the store may be shared between
an event loop and other threads. Its behaviour is the specification the other backends
are tested against (tests/conformance).
"""

from __future__ import annotations

import heapq
import threading
from collections import deque
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyrula.workflows.errors import RunNotActive, StaleToken, WorkflowNotFound
from pyrula.workflows.events import INTERRUPT_SIGNAL, Event, EventType, dumps, loads, make_event
from pyrula.workflows.records import (
    AppendResult,
    ClaimedRun,
    FinishResult,
    FlowControl,
    ParkResult,
    PoisonPolicy,
    RenewResult,
    RequeueOutcome,
    RunHandle,
    RunInfo,
    RunStatus,
)
from pyrula.workflows.schedules.schedule import Schedule
from pyrula.workflows.stores.common import (
    NO_OWNER,
    TokenBucket,
    error_event,
    live_crashes,
    new_run_id,
    pick_owner,
    quarantine_error,
    records_run,
    requeued_event,
    schedule_from_store,
    schedule_to_store,
    started_event,
    submitted_event,
    validate_flow_control,
)
from pyrula.workflows.stores.waiters import ResultWaiters


def _copy(value: Any) -> Any:
    """A JSON round trip of ``value``: what a persistent store would hand back.

    Values are copied on the way in and on the way out, so a caller that mutates its
    params, a step result or an event it got back cannot rewrite the stored run (which
    would make a replay differ on this store only).
    """
    return loads(dumps(value))


@dataclass(slots=True)
class _Run:
    run_id: str
    name: str
    params: Any
    owner: str
    created_at: float
    updated_at: float
    start_id: str
    idempotency_key: str | None = None
    status: RunStatus = RunStatus.QUEUED
    attempt: int = 0
    journal: list[Event] = field(default_factory=list)
    lock_owner: str | None = None
    lock_expires: float = 0.0
    wake_at: float | None = None
    waiting_for: tuple[str, ...] = ()
    interrupt: Any = None
    signal_seq: dict[str, int] = field(default_factory=dict)
    cancel_requested: bool = False
    parked_seq: int = 0
    crashes: list[float] = field(default_factory=list)
    started_at: float | None = None
    finished_at: float | None = None
    result: Any = None
    error: dict[str, Any] | None = None
    successor_id: str | None = None

    def info(self) -> RunInfo:
        return RunInfo(
            run_id=self.run_id,
            name=self.name,
            status=self.status,
            attempt=self.attempt,
            params=_copy(self.params),
            owner=self.owner or None,
            created_at=self.created_at,
            updated_at=self.updated_at,
            started_at=self.started_at,
            finished_at=self.finished_at,
            result=_copy(self.result),
            error=_copy(self.error),
            wake_at=self.wake_at,
            waiting_for=self.waiting_for,
            interrupt=_copy(self.interrupt),
            idempotency_key=self.idempotency_key,
            start_id=self.start_id,
            successor_id=self.successor_id,
        )

    def append(self, events: Sequence[Event], now: float) -> int:
        for event in events:
            stored = _copy(event)
            stored["seq"] = len(self.journal) + 1
            self.journal.append(stored)
        self.updated_at = now
        return len(self.journal)


@dataclass(slots=True)
class _Schedule:
    definition: str  # Schedule.definition() as JSON
    name: str
    paused: bool
    next_run_at: float
    last_run_id: str | None = None
    last_run_at: float | None = None

    def load(self) -> Schedule:
        return schedule_from_store(
            self.definition, paused=self.paused, next_run_at=self.next_run_at,
            last_run_id=self.last_run_id, last_run_at=self.last_run_at,
        )


class MemoryStore:
    """An in-process store for development and tests. Nothing survives the process."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._runs: dict[str, _Run] = {}
        self._idempotency: dict[tuple[str, str], str] = {}
        # name -> owner -> FIFO of run ids; served counts drive deficit round robin.
        self._queues: dict[str, dict[str, deque[str]]] = {}
        self._served: dict[str, dict[str, float]] = {}
        self._timers: list[tuple[float, str]] = []
        self._flow: dict[str, FlowControl] = {}
        self._buckets: dict[str, TokenBucket] = {}
        self._waiters = ResultWaiters()
        self._binding: tuple[str | None, str | None] = (None, None)
        self._workers: dict[str, tuple[float, tuple[str, ...]]] = {}
        self._schedules: dict[str, _Schedule] = {}

    # --- submit ---------------------------------------------------------------------

    async def submit(
        self,
        name: str,
        params: Any,
        *,
        now: float,
        owner: str | None = None,
        idempotency_key: str | None = None,
    ) -> tuple[RunHandle, bool]:
        with self._lock:
            if idempotency_key is not None:
                existing = self._idempotency.get((name, idempotency_key))
                if existing is not None:
                    return RunHandle(name, existing), False
            run = self._new_run(name, params, owner or NO_OWNER, now, idempotency_key, None)
            run.append([submitted_event(now, name, params, owner, idempotency_key)], now)
            if idempotency_key is not None:
                self._idempotency[(name, idempotency_key)] = run.run_id
            return RunHandle(name, run.run_id), True

    def _new_run(
        self,
        name: str,
        params: Any,
        owner: str,
        now: float,
        idempotency_key: str | None,
        start_id: str | None,
    ) -> _Run:
        run_id = new_run_id(now)
        run = _Run(
            run_id=run_id,
            name=name,
            params=_copy(params),
            owner=owner,
            created_at=now,
            updated_at=now,
            start_id=start_id or run_id,
            idempotency_key=idempotency_key,
        )
        self._runs[run_id] = run
        self._enqueue(run)
        return run

    def _enqueue(self, run: _Run) -> None:
        run.status = RunStatus.QUEUED
        run.lock_owner = None
        run.wake_at = None
        run.waiting_for = ()
        run.interrupt = None
        owners = self._queues.setdefault(run.name, {})
        served = self._served.setdefault(run.name, {})
        if run.owner not in owners or not owners[run.owner]:
            # A tenant that (re)appears starts level with the least-served active one,
            # so it neither starves the others nor waits behind their history, nor its
            # own: runs served while nobody else waited are not held against it (as DRR
            # resets the deficit of a queue that empties).
            active = [served.get(o, 0.0) for o, q in owners.items() if q]
            served[run.owner] = min(active) if active else 0.0
        owners.setdefault(run.owner, deque()).append(run.run_id)

    # --- attempt writes -------------------------------------------------------------

    def _fenced(self, run_id: str, token: int) -> _Run:
        run = self._runs.get(run_id)
        if run is None:
            raise WorkflowNotFound(f"no run with id {run_id!r}")
        if run.status is not RunStatus.RUNNING or run.attempt != token:
            raise StaleToken(run_id, token, run.attempt)
        return run

    async def append(
        self, run_id: str, token: int, events: Sequence[Event], *, now: float, lock_ttl: float
    ) -> AppendResult:
        with self._lock:
            run = self._fenced(run_id, token)
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
        with self._lock:
            run = self._fenced(run_id, token)
            last = run.append(events, now)
            arrived = any(run.signal_seq.get(s, 0) > known_seq for s in signals)
            if arrived or run.cancel_requested:
                tail = [_copy(e) for e in run.journal[known_seq:]]
                return ParkResult(False, last, tail, run.cancel_requested)
            run.lock_owner = None
            run.parked_seq = last
            run.status = RunStatus.WAITING if signals else RunStatus.SLEEPING
            run.waiting_for = tuple(signals)
            run.interrupt = _copy(interrupt) if INTERRUPT_SIGNAL in signals else None
            run.wake_at = wake_at
            if wake_at is not None:
                heapq.heappush(self._timers, (wake_at, run.run_id))
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
        with self._lock:
            run = self._fenced(run_id, token)
            events = [dict(e) for e in events]
            successor_id = None
            if status is RunStatus.CONTINUED:
                successor = self._new_run(
                    run.name, successor_params, run.owner, now, None, run.start_id
                )
                successor.append(
                    [submitted_event(now, run.name, successor_params, run.owner or None, None)],
                    now,
                )
                successor.journal[0]["predecessor"] = run.run_id
                run.successor_id = successor_id = successor.run_id
                events[-1]["successor"] = successor.run_id
            last = run.append(events, now)
            self._end(run, status, now, result=result, error=error)
            return FinishResult(last, successor_id)

    def _end(
        self,
        run: _Run,
        status: RunStatus,
        now: float,
        *,
        result: Any = None,
        error: dict[str, Any] | None = None,
    ) -> None:
        if run.status is RunStatus.QUEUED:
            self._dequeue(run)
        run.status = status
        run.result = _copy(result)
        run.error = _copy(error)
        run.lock_owner = None
        run.wake_at = None
        run.waiting_for = ()
        run.finished_at = now
        run.updated_at = now
        self._waiters.notify(run.run_id)

    def _dequeue(self, run: _Run) -> None:
        queue = self._queues.get(run.name, {}).get(run.owner)
        if queue is not None:
            try:
                queue.remove(run.run_id)
            except ValueError:
                pass

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
        with self._lock:
            run = self._fenced(run_id, token)
            run.append(events, now)
            return self._requeue(run, now, reason, crash, poison, crash_detail)

    def _requeue(
        self,
        run: _Run,
        now: float,
        reason: str,
        crash: bool,
        poison: PoisonPolicy | None,
        crash_detail: Mapping[str, Any] | None,
    ) -> RequeueOutcome:
        counted = None
        if crash:
            policy = poison or PoisonPolicy()
            run.crashes = live_crashes(run.crashes, now, policy.retry_ttl_s) + [now]
            counted = len(run.crashes)
            if counted > policy.max_retries:
                error = quarantine_error(counted, crash_detail)
                run.append([error_event(now, error)], now)
                self._end(run, RunStatus.FAILED, now, error=error)
                return RequeueOutcome(run.run_id, True)
        if run.cancel_requested:
            run.append([make_event(EventType.RUN_CANCELLED, now)], now)
            self._end(run, RunStatus.CANCELLED, now)
            return RequeueOutcome(run.run_id, False)
        run.append([requeued_event(now, reason, counted)], now)
        self._enqueue(run)
        return RequeueOutcome(run.run_id, False)

    # --- work queue -----------------------------------------------------------------

    async def claim(
        self,
        worker_id: str,
        names: Sequence[str],
        *,
        limit: int,
        now: float,
        lock_ttl: float,
    ) -> list[ClaimedRun]:
        claimed: list[ClaimedRun] = []
        with self._lock:
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
                    claimed.append(self._take(run, worker_id, now, lock_ttl))
        return claimed

    async def claim_run(
        self, run_id: str, worker_id: str, *, now: float, lock_ttl: float
    ) -> ClaimedRun | None:
        with self._lock:
            run = self._runs.get(run_id)
            if run is None or run.status is not RunStatus.QUEUED:
                return None
            self._dequeue(run)
            return self._take(run, worker_id, now, lock_ttl)

    def _take(self, run: _Run, worker_id: str, now: float, lock_ttl: float) -> ClaimedRun:
        run.attempt += 1
        run.status = RunStatus.RUNNING
        run.lock_owner = worker_id
        run.lock_expires = now + lock_ttl
        if run.started_at is None:
            run.started_at = now
        run.append([started_event(now, run.attempt, worker_id)], now)
        return ClaimedRun(
            run_id=run.run_id,
            name=run.name,
            params=_copy(run.params),
            owner=run.owner or None,
            token=run.attempt,
            journal=[_copy(e) for e in run.journal[run.parked_seq :]],
            base_seq=run.parked_seq,
            start_id=run.start_id,
            created_at=run.created_at,
            crashes=tuple(run.crashes),
        )

    def _pick(self, name: str, now: float, blocked: set[str]) -> _Run | None:
        owners = self._queues.get(name)
        if not owners:
            return None
        served = self._served.setdefault(name, {})
        candidates: dict[str, tuple[float, float]] = {}
        for tenant, queue in owners.items():
            if queue and tenant not in blocked:
                head = self._runs[queue[0]]
                candidates[tenant] = (served.get(tenant, 0.0), head.created_at)
        while candidates:
            owner = pick_owner(candidates)
            if owner is None:
                break
            if self._flow_allows(owner, now):
                served[owner] = served.get(owner, 0.0) + 1.0
                return self._runs[owners[owner].popleft()]
            blocked.add(owner)
            del candidates[owner]
        return None

    def _flow_allows(self, owner: str, now: float) -> bool:
        flow = self._flow.get(owner)
        if flow is None:
            return True
        if flow.max_concurrent is not None:
            running = sum(
                1 for r in self._runs.values() if r.owner == owner and r.status is RunStatus.RUNNING
            )
            if running >= flow.max_concurrent:
                return False
        if flow.max_starts_per_second is not None:
            bucket = self._buckets.setdefault(owner, TokenBucket(1.0, now))
            return bucket.take(flow.max_starts_per_second, now)
        return True

    async def renew(
        self, worker_id: str, held: Mapping[str, int], *, now: float, lock_ttl: float
    ) -> RenewResult:
        lost: set[str] = set()
        cancel: set[str] = set()
        with self._lock:
            for run_id, token in held.items():
                run = self._runs.get(run_id)
                if run is None or run.status is not RunStatus.RUNNING or run.attempt != token:
                    lost.add(run_id)
                    continue
                run.lock_expires = now + lock_ttl
                if run.cancel_requested:
                    cancel.add(run_id)
        return RenewResult(frozenset(lost), frozenset(cancel))

    async def wake_due(self, *, now: float, limit: int) -> int:
        woken = 0
        with self._lock:
            while self._timers and woken < limit and self._timers[0][0] <= now:
                wake_at, run_id = heapq.heappop(self._timers)
                run = self._runs.get(run_id)
                if run is None or run.wake_at != wake_at:
                    continue  # stale timer entry: the run was woken or re-parked since
                if run.status not in (RunStatus.SLEEPING, RunStatus.WAITING):
                    continue
                run.append([make_event(EventType.RUN_WOKEN, now, reason="timer")], now)
                self._enqueue(run)
                woken += 1
        return woken

    async def reclaim(
        self,
        names: Sequence[str] | None,
        *,
        now: float,
        limit: int,
        poison: PoisonPolicy,
    ) -> list[RequeueOutcome]:
        with self._lock:
            return self._reclaim(names, now, limit, poison)

    def _reclaim(
        self, names: Sequence[str] | None, now: float, limit: int, poison: PoisonPolicy
    ) -> list[RequeueOutcome]:
        wanted = None if names is None else set(names)
        out: list[RequeueOutcome] = []
        for run in list(self._runs.values()):
            if len(out) >= limit:
                break
            if run.status is not RunStatus.RUNNING or run.lock_expires > now:
                continue
            if wanted is not None and run.name not in wanted:
                continue
            detail = {"cause": "worker_crash", "worker": run.lock_owner, "attempt": run.attempt}
            out.append(self._requeue(run, now, "orphaned", True, poison, detail))
        return out

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
        with self._lock:
            out = []
            for run in list(self._runs.values()):
                if run.status is RunStatus.RUNNING and run.lock_owner == worker_id:
                    crash = charged is None or run.run_id in charged
                    detail = {"cause": "worker_crash", "worker": worker_id,
                              "attempt": run.attempt, **dict(crash_detail or {})}
                    out.append(self._requeue(run, now, "orphaned", crash, poison, detail))
            return out

    async def requeue_unheld(
        self, worker_id: str, held: Collection[str], *, now: float
    ) -> list[RequeueOutcome]:
        with self._lock:
            return [
                self._requeue(run, now, "store_unavailable", False, None, None)
                for run in list(self._runs.values())
                if run.status is RunStatus.RUNNING and run.lock_owner == worker_id
                and run.run_id not in held
            ]

    def recover_pending_runs(self, name: str) -> int:
        import time

        with self._lock:
            return len(self._reclaim([name], time.time(), 1 << 30, PoisonPolicy()))

    # --- run control ----------------------------------------------------------------

    def _get(self, run_id: str) -> _Run:
        run = self._runs.get(run_id)
        if run is None:
            raise WorkflowNotFound(f"no run with id {run_id!r}")
        return run

    async def signal(self, run_id: str, name: str, payload: Any, *, now: float) -> None:
        with self._lock:
            run = self._get(run_id)
            if run.status.terminal:
                raise RunNotActive(f"run {run_id} has already ended ({run.status.value})")
            interrupt = name == INTERRUPT_SIGNAL
            type_ = EventType.INTERRUPT_RESUMED if interrupt else EventType.SIGNAL_RECEIVED
            event = make_event(type_, now, name=name, payload=payload)
            run.append([event], now)
            run.signal_seq[name] = len(run.journal)
            if run.status is RunStatus.WAITING and name in run.waiting_for:
                self._enqueue(run)

    async def cancel(self, run_id: str, *, now: float) -> bool:
        with self._lock:
            run = self._get(run_id)
            if run.status.terminal:
                return False
            if run.status is RunStatus.RUNNING:
                run.cancel_requested = True
                run.updated_at = now
                return True
            run.append([make_event(EventType.RUN_CANCELLED, now)], now)
            self._end(run, RunStatus.CANCELLED, now)
            return True

    async def wake_run(self, run_id: str, *, now: float) -> bool:
        with self._lock:
            run = self._get(run_id)
            if run.status is not RunStatus.SLEEPING:
                return False
            run.append([make_event(EventType.RUN_WOKEN, now, reason="manual")], now)
            self._enqueue(run)
            return True

    # --- reads ----------------------------------------------------------------------

    async def get_run(self, run_id: str) -> RunInfo | None:
        with self._lock:
            run = self._runs.get(run_id)
            return None if run is None else run.info()

    async def read_events(self, run_id: str, after_seq: int = 0) -> list[Event]:
        with self._lock:
            return [_copy(e) for e in self._get(run_id).journal[after_seq:]]

    async def list_runs(
        self,
        *,
        name: str | None = None,
        status: RunStatus | None = None,
        owner: str | None = None,
        limit: int = 100,
        before: tuple[float, str] | None = None,
    ) -> list[RunInfo]:
        with self._lock:
            runs = sorted(self._runs.values(), key=lambda r: (r.created_at, r.run_id), reverse=True)
            out: list[RunInfo] = []
            for run in runs:
                if before is not None and (run.created_at, run.run_id) >= before:
                    continue
                if name is not None and run.name != name:
                    continue
                if status is not None and run.status != status:
                    continue
                if owner is not None and run.owner != owner:
                    continue
                out.append(run.info())
                if len(out) >= limit:
                    break
            return out

    async def wait_result(self, run_id: str, timeout: float | None) -> RunInfo:
        return await self._waiters.wait(run_id, self._terminal_info, timeout)

    async def _terminal_info(self, run_id: str) -> RunInfo | None:
        with self._lock:
            run = self._get(run_id)
            return run.info() if run.status.terminal else None

    # --- archiving (ArchivingStore) --------------------------------------------------

    async def ended_runs(
        self, *, after: tuple[float, str] | None, until: float, limit: int
    ) -> list[tuple[float, str]]:
        """(finished_at, run_id) of ended runs after the cursor ``after`` and at or before
        ``until``, oldest first, at most ``limit``."""
        with self._lock:
            ended = sorted(
                (run.finished_at, run.run_id) for run in self._runs.values()
                if run.status.terminal and run.finished_at is not None
                and run.finished_at <= until
                and (after is None or (run.finished_at, run.run_id) > after)
            )
        return ended[:limit]

    async def expire_finished(self, run_ids: Sequence[str], ttl: float) -> None:
        """A no-op: the memory store keeps finished runs for as long as it lives."""
        return None

    # --- membership -----------------------------------------------------------------

    async def register_worker(
        self, worker_id: str, names: Sequence[str], *, now: float, ttl: float
    ) -> None:
        with self._lock:
            self._workers[worker_id] = (now + ttl, tuple(names))

    async def unregister_worker(self, worker_id: str) -> None:
        with self._lock:
            self._workers.pop(worker_id, None)

    async def stranded(self, *, now: float) -> list[str]:
        with self._lock:
            served = {n for expires, names in self._workers.values() if expires > now
                      for n in names}
            return sorted(
                name for name, owners in self._queues.items()
                if name not in served and any(owners.values())
            )

    async def fail_stranded(
        self, name: str, *, older_than: float, now: float, limit: int, error: dict[str, Any]
    ) -> list[str]:
        failed: list[str] = []
        with self._lock:
            for queue in list(self._queues.get(name, {}).values()):
                for run_id in list(queue):
                    run = self._runs[run_id]
                    if len(failed) >= limit or run.updated_at > older_than:
                        continue
                    run.append([error_event(now, error)], now)
                    self._end(run, RunStatus.FAILED, now, error=dict(error))
                    failed.append(run_id)
        return failed

    # --- flow control ---------------------------------------------------------------

    def flow_control_set(
        self,
        owner: str,
        max_concurrent: int | None = None,
        max_starts_per_second: float | None = None,
    ) -> None:
        validate_flow_control(owner, max_concurrent, max_starts_per_second)
        with self._lock:
            self._flow[owner] = FlowControl(owner, max_concurrent, max_starts_per_second)
            self._buckets.pop(owner, None)

    def flow_control_get(self, owner: str) -> FlowControl | None:
        with self._lock:
            return self._flow.get(owner)

    def flow_control_delete(self, owner: str) -> bool:
        with self._lock:
            self._buckets.pop(owner, None)
            return self._flow.pop(owner, None) is not None

    async def aflow_control_set(
        self,
        owner: str,
        max_concurrent: int | None = None,
        max_starts_per_second: float | None = None,
    ) -> None:
        self.flow_control_set(owner, max_concurrent, max_starts_per_second)

    async def aflow_control_get(self, owner: str) -> FlowControl | None:
        return self.flow_control_get(owner)

    async def aflow_control_delete(self, owner: str) -> bool:
        return self.flow_control_delete(owner)

    # --- schedules ------------------------------------------------------------------

    def schedule_create(self, schedule: Schedule, *, now: float | None = None) -> Schedule:
        armed, definition = schedule_to_store(schedule, now)
        with self._lock:
            old = self._schedules.get(armed.schedule_id)
            record = _Schedule(definition, armed.name, False, armed.next_run_at.timestamp())
            if old is not None:
                record.last_run_id, record.last_run_at = old.last_run_id, old.last_run_at
            self._schedules[armed.schedule_id] = record
            return record.load()

    def schedule_get(self, schedule_id: str) -> Schedule | None:
        with self._lock:
            record = self._schedules.get(schedule_id)
            return None if record is None else record.load()

    def schedule_list(self) -> list[Schedule]:
        with self._lock:
            return [self._schedules[i].load() for i in sorted(self._schedules)]

    def schedule_delete(self, schedule_id: str) -> bool:
        with self._lock:
            return self._schedules.pop(schedule_id, None) is not None

    async def aschedule_create(
        self, schedule: Schedule, *, now: float | None = None
    ) -> Schedule:
        return self.schedule_create(schedule, now=now)

    async def aschedule_get(self, schedule_id: str) -> Schedule | None:
        return self.schedule_get(schedule_id)

    async def aschedule_list(self) -> list[Schedule]:
        return self.schedule_list()

    async def aschedule_delete(self, schedule_id: str) -> bool:
        return self.schedule_delete(schedule_id)

    async def schedules_due(
        self, names: Sequence[str], *, now: float, limit: int
    ) -> list[Schedule]:
        wanted = set(names)
        with self._lock:
            due = sorted(
                (r.next_run_at, i) for i, r in self._schedules.items()
                if not r.paused and r.next_run_at <= now and r.name in wanted
            )
            return [self._schedules[i].load() for _, i in due[: max(0, limit)]]

    async def schedule_advance(
        self,
        schedule_id: str,
        *,
        expected_next_run_at: float | None,
        next_run_at: float | None,
        run_id: str | None = None,
        run_at: float | None = None,
    ) -> bool:
        with self._lock:
            record = self._schedules.get(schedule_id)
            if record is None:
                return False
            if records_run(record.last_run_at, run_id, run_at):
                record.last_run_id, record.last_run_at = run_id, run_at
            if expected_next_run_at is None or next_run_at is None:
                return False
            if record.next_run_at != expected_next_run_at:
                return False
            record.next_run_at = next_run_at
            return True

    async def schedule_set_paused(
        self, schedule_id: str, paused: bool, *, next_run_at: float | None = None
    ) -> bool:
        with self._lock:
            record = self._schedules.get(schedule_id)
            if record is None:
                return False
            record.paused = bool(paused)
            if next_run_at is not None:
                record.next_run_at = next_run_at
            return True

    # --- lifecycle ------------------------------------------------------------------

    async def bind(
        self, project: str | None, environment: str | None
    ) -> tuple[str | None, str | None]:
        with self._lock:
            if self._binding[0] is None:
                self._binding = (project, self._binding[1])
            if self._binding[1] is None:
                self._binding = (self._binding[0], environment)
            return self._binding

    def ping(self) -> None:
        return None

    async def aping(self) -> None:
        return None

    def close(self) -> None:
        return None

    async def aclose(self) -> None:
        return None

    def __repr__(self) -> str:
        return f"MemoryStore(runs={len(self._runs)})"


