"""The memory store's shared state: every run record and queue, under one lock.

Each component of the memory store holds the one :class:`MemoryState` and does each of
its operations under ``lock``, so every call is atomic and the store may be shared
between an event loop and other threads. The transitions several components make (a run
is created, enters its queue, leaves it, ends) are methods here, written once.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pyrula.workflows.errors import StaleToken, WorkflowNotFound
from pyrula.workflows.events import Event, dumps, loads
from pyrula.workflows.limits import LimitKeys
from pyrula.workflows.records import RunInfo, RunStatus
from pyrula.workflows.stores.waiters import ResultWaiters

logger = logging.getLogger(__name__)


def json_copy(value: Any) -> Any:
    """A JSON round trip of ``value``: what a persistent store would hand back.

    Values are copied on the way in and on the way out, so a caller that mutates its
    params, a step result or an event it got back cannot rewrite the stored run (which
    would make a replay differ on this store only).
    """
    return loads(dumps(value))


@dataclass(slots=True)
class RunRecord:
    """One run as the memory store holds it (``owner`` is NO_OWNER for none)."""

    run_id: str
    name: str
    params: Any
    owner: str
    created_at: float
    updated_at: float
    start_id: str
    #: When the run last entered its queue (submitted, requeued, woken): its queue age.
    queued_at: float = 0.0
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
    #: A child ended while the run ran (``nudge``): its next park on CHILD_SIGNAL does not.
    nudged: bool = False
    parked_seq: int = 0
    crashes: list[float] = field(default_factory=list)
    #: A crash was counted and no attempt has parked or ended the run since: queued, it
    #: waits in its workflow's ``suspects`` queue, not its owner's.
    suspect: bool = False
    started_at: float | None = None
    finished_at: float | None = None
    result: Any = None
    error: dict[str, Any] | None = None
    successor_id: str | None = None
    #: 0..9: among its owner's queued runs, a higher one is claimed first.
    priority: int = 0
    #: Its concurrency and rate keys; None while not computed (submitted without them).
    limit_keys: LimitKeys | None = None
    #: Queued in its key's waiting line (``MemoryState.held``), not its owner's queue.
    held: bool = False

    def info(self) -> RunInfo:
        return RunInfo(
            run_id=self.run_id,
            name=self.name,
            status=self.status,
            attempt=self.attempt,
            params=json_copy(self.params),
            owner=self.owner or None,
            created_at=self.created_at,
            updated_at=self.updated_at,
            started_at=self.started_at,
            finished_at=self.finished_at,
            result=json_copy(self.result),
            error=json_copy(self.error),
            wake_at=self.wake_at,
            waiting_for=self.waiting_for,
            interrupt=json_copy(self.interrupt),
            idempotency_key=self.idempotency_key,
            start_id=self.start_id,
            successor_id=self.successor_id,
            priority=self.priority,
        )

    def append(self, events: Sequence[Event], now: float) -> int:
        """Copy ``events`` onto the journal, numbering them; returns the last seq."""
        for event in events:
            stored = json_copy(event)
            stored["seq"] = len(self.journal) + 1
            self.journal.append(stored)
        self.updated_at = now
        return len(self.journal)

    def tail(self, after_seq: int) -> list[Event]:
        """Copies of the journal's events after ``after_seq``."""
        return [json_copy(e) for e in self.journal[after_seq:]]


class MemoryState:
    """The runs, their queues and timers, and the lock every operation holds.

    ``queues`` maps a workflow name to its owners' queues of run ids (highest priority
    first, FIFO within a priority: ``enqueue``); ``served`` counts the
    claims of each owner there, which deficit round robin levels. ``timers`` is a heap of
    (wake_at, run_id), possibly holding stale entries (a run woken or parked again since).
    ``suspects`` maps a workflow name to the FIFO of its queued suspects, put aside from
    their owners' queues: only ``claim_suspect`` (or a claim by id) takes them.
    Whoever waits on a run's result is woken when a run ends: a coroutine through
    ``waiters``, a thread blocked in a synchronous call through ``ended``.
    """

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.runs: dict[str, RunRecord] = {}
        self.idempotency: dict[tuple[str, str], str] = {}
        self.queues: dict[str, dict[str, deque[str]]] = {}
        self.served: dict[str, dict[str, float]] = {}
        self.timers: list[tuple[float, str]] = []
        self.suspects: dict[str, deque[str]] = {}
        #: (name, line) -> the FIFO of queued runs waiting for their key's limit
        #: (``held_line``); a claim admits them into their owners' queues.
        self.held: dict[tuple[str, str], deque[str]] = {}
        self.waiters = ResultWaiters()
        self.ended = threading.Condition(self.lock)

    def get(self, run_id: str) -> RunRecord:
        """The run ``run_id``; raises WorkflowNotFound if there is none."""
        run = self.runs.get(run_id)
        if run is None:
            raise WorkflowNotFound(f"no run with id {run_id!r}")
        return run

    def fenced(self, run_id: str, token: int) -> RunRecord:
        """The run ``run_id`` if attempt ``token`` holds it; raises StaleToken otherwise."""
        run = self.get(run_id)
        if run.status is not RunStatus.RUNNING or run.attempt != token:
            raise StaleToken(run_id, token, run.attempt)
        return run

    def new_run(
        self,
        run_id: str,
        name: str,
        params: Any,
        owner: str,
        now: float,
        *,
        idempotency_key: str | None = None,
        start_id: str | None = None,
        priority: int = 0,
        limit_keys: LimitKeys | None = None,
    ) -> RunRecord:
        """Store a new run and queue it (its journal still empty)."""
        run = RunRecord(
            run_id=run_id,
            name=name,
            params=json_copy(params),
            owner=owner,
            created_at=now,
            updated_at=now,
            start_id=start_id or run_id,
            idempotency_key=idempotency_key,
            priority=priority,
            limit_keys=limit_keys,
        )
        self.runs[run_id] = run
        self.enqueue(run, now)
        return run

    def enqueue(self, run: RunRecord, now: float) -> None:
        """Queue ``run`` behind its owner's other runs of its workflow of its priority or
        higher (ahead of those of a lower one), claimable from ``now``."""
        run.status = RunStatus.QUEUED
        run.queued_at = now
        run.lock_owner = None
        run.wake_at = None
        run.waiting_for = ()
        run.interrupt = None
        if run.suspect:
            self.suspects.setdefault(run.name, deque()).append(run.run_id)
            return
        line = held_line(run.limit_keys)
        if line is not None:
            run.held = True
            self.held.setdefault((run.name, line), deque()).append(run.run_id)
            return
        self.admit(run)

    def admit(self, run: RunRecord) -> None:
        """Put queued ``run`` into its owner's queue (out of its key's waiting line)."""
        run.held = False
        owners = self.queues.setdefault(run.name, {})
        served = self.served.setdefault(run.name, {})
        if run.owner not in owners or not owners[run.owner]:
            # A tenant that (re)appears starts level with the least-served active one,
            # so it neither starves the others nor waits behind their history, nor its
            # own: runs served while nobody else waited are not held against it (as DRR
            # resets the deficit of a queue that empties).
            active = [served.get(o, 0.0) for o, q in owners.items() if q]
            served[run.owner] = min(active) if active else 0.0
        self._place(owners.setdefault(run.owner, deque()), run)

    def _place(self, queue: deque[str], run: RunRecord) -> None:
        """Put ``run`` into its owner's ``queue``, kept in (priority descending, then
        FIFO) order: after every run of its priority or higher. A priority-0 run (the
        lowest) is simply appended."""
        at = len(queue)
        if run.priority > 0:
            while at > 0 and self.runs[queue[at - 1]].priority < run.priority:
                at -= 1
        queue.insert(at, run.run_id)

    def dequeue(self, run: RunRecord) -> None:
        """Take ``run`` out of its queue (or the suspects'), if it is there."""
        if run.suspect:
            queue = self.suspects.get(run.name)
        elif run.held:
            run.held = False
            line = held_line(run.limit_keys)
            queue = self.held.get((run.name, line)) if line is not None else None
        else:
            queue = self.queues.get(run.name, {}).get(run.owner)
        if queue is not None:
            try:
                queue.remove(run.run_id)
            except ValueError:
                pass

    def queued(self, name: str) -> list[str]:
        """The ids of every queued run of ``name``: its owners' queues, then its suspects."""
        ids = [run_id for queue in self.queues.get(name, {}).values() for run_id in queue]
        held = [r for (n, _), line in self.held.items() if n == name for r in line]
        return ids + held + list(self.suspects.get(name, ()))

    def end(
        self,
        run: RunRecord,
        status: RunStatus,
        now: float,
        *,
        result: Any = None,
        error: dict[str, Any] | None = None,
    ) -> None:
        """Move ``run`` to the terminal ``status`` and wake whoever waits on its result."""
        if run.status is RunStatus.QUEUED:
            self.dequeue(run)
        run.status = status
        run.suspect = False
        run.result = json_copy(result)
        run.error = json_copy(error)
        run.lock_owner = None
        run.wake_at = None
        run.waiting_for = ()
        run.finished_at = now
        run.updated_at = now
        self.waiters.notify(run.run_id)
        self.ended.notify_all()


def held_line(keys: LimitKeys | None) -> str | None:
    """The waiting line of a queued run with ``keys``: its concurrency key's (a run with
    both waits in that one, its rate checked as it leaves), else its rate key's; None
    for a run without keys (it goes straight to its owner's queue)."""
    if keys is None:
        return None
    if keys.concurrency is not None:
        return "c:" + keys.concurrency
    if keys.rate is not None:
        return "r:" + keys.rate
    return None
