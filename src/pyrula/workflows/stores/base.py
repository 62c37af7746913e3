"""The Store seam: the one interface the worker, the engine and the clients talk to.

Small protocols by concern, composed into the core :class:`RunStore` (every run
operation, all coroutines); :class:`Store` adds the administration coroutines
(``admin.py``) and their synchronous twins. Optional abilities are named in
``capabilities.py`` and resolved once by ``capabilities_of``. Every state change is one atomic
call (one transaction on SQLite, one script on Valkey). Every write made by an attempt
carries its fencing token (the attempt number under the lock); a stale token is refused
inside that same atomic step with :class:`~pyrula.workflows.errors.StaleToken`.

Times (``now``) come from the caller's clock, so a manual clock drives every store alike.
The memory store is the reference implementation; ``tests/conformance`` runs against all.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from pyrula.workflows.events import Event
from pyrula.workflows.records import (
    AppendResult,
    Claimed,
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
    SuspectsAt,
)
from pyrula.workflows.schedules.schedule import Schedule
from pyrula.workflows.stores.admin import AsyncAdmin
from pyrula.workflows.stores.capabilities import ArchiveSource

__all__ = [
    "ArchiveSource", "AsyncAdmin", "AttemptStore", "Membership", "RunControl", "RunReader",
    "RunStore", "RunSubmitter", "ScheduleStore", "Store", "SyncCalls", "WorkQueue",
]


class RunSubmitter(Protocol):
    async def submit(
        self,
        name: str,
        params: Any,
        *,
        now: float,
        owner: str | None = None,
        idempotency_key: str | None = None,
        priority: int = 0,
    ) -> tuple[RunHandle, bool]:
        """Create a queued run with a ``run:submitted`` event; return (handle, created).

        Atomic with the idempotency check: a second submit with the same
        ``(name, idempotency_key)`` returns the first run's handle and ``created`` False.
        ``priority`` (0..9) places the run among its owner's queued runs of ``name``:
        after those of its priority or higher, before those of a lower one. The run keeps
        it whenever it is queued again (requeued, woken); its ``continue_as_new``
        successor inherits it. Raises TypeError / ValueError (writing nothing) for a
        priority that is not an int in 0..9.
        """
        ...


class AttemptStore(Protocol):
    """The writes of one attempt, each fenced by its ``token``. Used by the engine."""

    async def append(
        self, run_id: str, token: int, events: Sequence[Event], *, now: float, lock_ttl: float
    ) -> AppendResult:
        """Append events (seq assigned here) and renew the run's lock. Atomic, fenced."""
        ...

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
        """Append events, then park the run and release its lock. Atomic, fenced.

        The run becomes ``waiting`` if ``signals`` is not empty, else ``sleeping``; it is
        woken at ``wake_at`` (if given) or by one of ``signals``. If one of ``signals``
        arrived after ``known_seq``, or ``signals`` holds ``CHILD_SIGNAL`` and the run was
        nudged while it ran (see ``nudge``), or a cancel was requested, the run is not
        parked and keeps its lock; the result then carries the journal after
        ``known_seq`` (nothing new, for a nudge alone). Parked or not, the nudge mark is
        cleared in the same atomic step. ``interrupt`` is the payload of a pending
        ``ctx.interrupt`` (shown in RunInfo).
        """
        ...

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
        """Append events (the last one terminal), end the run and release its lock.

        With ``status`` CONTINUED, the successor (same name, owner and start id) is queued
        in the same atomic step and its id is written into the terminal event's
        ``successor`` field. Wakes anyone waiting on the result.
        """
        ...

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
        """Append events and ``run:requeued`` (reason), release the lock, queue the run.

        With ``crash`` the run's crash counter goes up; past ``poison.max_retries`` crashes
        within ``poison.retry_ttl_s`` the run is quarantined instead (``run:error`` code
        ``max_retries`` with ``crash_detail`` in its detail). Atomic, fenced.
        """
        ...


class WorkQueue(Protocol):
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
        """Claim up to ``limit`` queued runs of ``names`` for this worker. Atomic per run.

        Picks by deficit round robin across owners (the least-served owner next), FIFO
        within one owner, honouring flow control; bumps the attempt (the fencing token),
        takes the lock until ``now + lock_ttl`` and appends ``run:started`` (with
        ``"build": build``, the code the worker serves, unless None). Each run comes with
        its journal after the seq where it last parked (see ClaimedRun).

        Never returns a suspect (see ClaimedRun): a run requeued with a crash counted is
        queued apart from its owner's queue (still ``queued``), until ``claim_suspect``
        takes it. ``Claimed.suspects`` says where this claim saw suspects waiting (a
        sharded store: on the shards it visited).
        """
        ...

    async def claim_suspect(
        self,
        worker_id: str,
        at: Sequence[SuspectsAt],
        *,
        now: float,
        lock_ttl: float,
        build: str | None = None,
    ) -> ClaimedRun | None:
        """Claim one put-aside suspect (as ``claim`` claims a run) from the first place in
        ``at`` that holds one whose owner flow control lets start: the one with the most
        crashes counted (a poison run is found sooner), then the longest-waiting (a sharded
        store looks at the first 64 waiting on the shard). None if there is none. The
        caller runs it alone. Atomic."""
        ...

    async def claim_run(
        self, run_id: str, worker_id: str, *, now: float, lock_ttl: float,
        build: str | None = None,
    ) -> ClaimedRun | None:
        """Claim this one run if it is queued (as ``claim`` does; a put-aside suspect too,
        returned with ``suspect`` set), else return None."""
        ...

    async def renew(
        self, worker_id: str, held: Mapping[str, int], *, now: float, lock_ttl: float
    ) -> RenewResult:
        """Extend the locks of all ``held`` runs (run id -> token) in one call."""
        ...

    async def wake_due(self, *, now: float, limit: int) -> int:
        """Queue up to ``limit`` parked runs whose wake time has passed (``run:woken``)."""
        ...

    async def reclaim_worker(
        self,
        worker_id: str,
        *,
        now: float,
        poison: PoisonPolicy,
        crash_detail: Mapping[str, Any] | None = None,
        charge: Collection[str] | None = None,
    ) -> list[RequeueOutcome]:
        """Requeue every run whose lock ``worker_id`` holds (its process is known to be
        dead), reason ``orphaned``, at once rather than after ``lock_ttl``.

        A crash is counted (as ``requeue`` with ``crash`` does: past the poison limit the
        run is quarantined) against the runs named in ``charge``, the ones that could have
        caused it; the others are requeued without one. ``charge`` None counts a crash
        against every run. Ids in ``charge`` the worker does not hold are ignored. Atomic
        per run (one transaction on SQLite, one script per shard on Valkey)."""
        ...

    async def requeue_unheld(
        self, worker_id: str, held: Collection[str], *, now: float
    ) -> list[RequeueOutcome]:
        """Requeue (reason ``store_unavailable``, no crash counted) every run whose lock
        ``worker_id`` holds but that is not in ``held``, the runs the worker knows it holds:
        those a claim took whose reply the worker never got (the connection was lost).
        A run with a cancel requested ends cancelled instead. Atomic per run."""
        ...

    async def reclaim(
        self,
        names: Sequence[str] | None,
        *,
        now: float,
        limit: int,
        poison: PoisonPolicy,
    ) -> list[RequeueOutcome]:
        """Requeue running runs whose lock expired (reason ``orphaned``), counting a crash
        against each: nothing tells which of a vanished worker's runs caused its end.

        ``names`` None means every workflow name.
        """
        ...


class RunControl(Protocol):
    async def signal(self, run_id: str, name: str, payload: Any, *, now: float) -> None:
        """Append ``signal:received``; a run waiting for ``name`` is queued. Atomic.

        A run that continued as new hands its inbox on: the signal goes to the live run
        of its chain (following ``successor_id`` in the same atomic step), whatever run id
        of the chain it was sent to; the earlier runs' journals stay as they ended.

        Raises WorkflowNotFound for an unknown run, RunNotActive when the run (the chain's
        last) has ended.
        """
        ...

    async def nudge(self, run_id: str, *, now: float) -> None:
        """Tell a parent that one of its children has ended, writing nothing in its
        journal. Atomic, idempotent:

        - a run ``waiting`` for ``CHILD_SIGNAL`` is queued (as that signal would queue it);
        - a ``running`` run is marked nudged, so that its attempt's next ``park`` waiting
          for ``CHILD_SIGNAL`` does not park (as if that signal had arrived since
          ``known_seq``): the wake-up a child ending between the parent's look at its
          children and its park would otherwise be lost;
        - any other run (queued, parked on something else, ended, unknown) is left as it
          is: its next attempt looks at its children anyway. Never raises for the run's
          state.
        """
        ...

    async def cancel(self, run_id: str, *, now: float) -> bool:
        """Cancel a run: at once unless it is running (then its worker is told).

        Returns False if the run had already ended.
        """
        ...

    async def wake_run(self, run_id: str, *, now: float) -> bool:
        """Wake a sleeping run now (``run:woken`` reason ``manual``)."""
        ...


class RunReader(Protocol):
    async def get_run(self, run_id: str) -> RunInfo | None: ...

    async def read_events(self, run_id: str, after_seq: int = 0) -> list[Event]:
        """The run's journal after ``after_seq``. Raises WorkflowNotFound if unknown."""
        ...

    async def list_runs(
        self,
        *,
        name: str | None = None,
        status: RunStatus | None = None,
        owner: str | None = None,
        limit: int = 100,
        before: tuple[float, str] | None = None,
    ) -> list[RunInfo]:
        """Runs newest first; ``before`` is the (created_at, run_id) of the last page's end."""
        ...

    async def wait_result(self, run_id: str, timeout: float | None) -> RunInfo:
        """Return the run once it has ended, woken by the store rather than a tight poll.

        Raises TimeoutError after ``timeout`` seconds, WorkflowNotFound if unknown.
        """
        ...


class Membership(Protocol):
    """Which live workers serve which workflow names (for stranded runs)."""

    async def register_worker(
        self, worker_id: str, names: Sequence[str], *, now: float, ttl: float
    ) -> None:
        """Record that ``worker_id`` serves ``names`` until ``now + ttl`` (renewed by calling
        again)."""
        ...

    async def unregister_worker(self, worker_id: str) -> None: ...

    async def stranded(self, *, now: float) -> list[str]:
        """Names with queued runs that no live worker serves."""
        ...

    async def served_names(self) -> list[str]:
        """Every name a worker of this store has ever served (registered), sorted: what a
        submit of an unknown name is checked against. Kept while the store lives."""
        ...

    async def fail_stranded(
        self, name: str, *, older_than: float, now: float, limit: int, error: dict[str, Any]
    ) -> list[str]:
        """End queued runs of ``name`` queued since before ``older_than`` with ``error``
        (``run:error``); returns their ids."""
        ...


class ScheduleStore(Protocol):
    """What the worker's schedule loop and the schedule controls need (the schedules'
    administration, ``aschedule_create`` and the rest, is in :class:`AsyncAdmin`).
    Each call is atomic."""

    async def schedules_due(
        self, names: Sequence[str], *, now: float, limit: int
    ) -> list[Schedule]:
        """Up to ``limit`` unpaused schedules of workflow ``names`` whose ``next_run_at``
        is at or before ``now``, the most overdue first."""
        ...

    async def schedule_advance(
        self,
        schedule_id: str,
        *,
        expected_next_run_at: float | None,
        next_run_at: float | None,
        run_id: str | None = None,
        run_at: float | None = None,
    ) -> bool:
        """Compare-and-set: move ``next_run_at`` from ``expected_next_run_at`` to
        ``next_run_at``; True if it moved (False if another worker moved it first, or the
        schedule is gone). ``expected_next_run_at`` None moves nothing.

        In the same atomic step, whatever the compare found, ``run_id`` (submitted at
        ``run_at``) becomes the schedule's last run unless a run submitted later is
        recorded already.
        """
        ...

    async def schedule_set_paused(
        self, schedule_id: str, paused: bool, *, next_run_at: float | None = None
    ) -> bool:
        """Pause or unpause; with ``next_run_at`` also set that. False if unknown."""
        ...


class RunStore(
    RunSubmitter, AttemptStore, WorkQueue, RunControl, RunReader, Membership, ScheduleStore,
    Protocol,
):
    """The core: every operation on runs, each a coroutine. What a backend must implement
    for the worker and the clients (``tests/conformance`` checks it on every backend)."""

    async def aping(self) -> None:
        """Raise StoreUnavailable unless the store answers."""
        ...

    async def bind(
        self, project: str | None, environment: str | None
    ) -> tuple[str | None, str | None]:
        """Record the project and environment this store serves, where none is recorded
        yet (values given as None record nothing); return what is recorded. Atomic."""
        ...

    async def aclose(self) -> None: ...


class SyncCalls(Protocol):
    """The synchronous calls users make from plain code: the administration twins
    (``SyncAdmin`` gives every backend the same ones) and ``close``."""

    def ping(self) -> None: ...

    def recover_pending_runs(self, name: str) -> int: ...

    def flow_control_set(
        self,
        owner: str,
        max_concurrent: int | None = None,
        max_starts_per_second: float | None = None,
    ) -> None: ...

    def flow_control_get(self, owner: str) -> FlowControl | None: ...

    def flow_control_delete(self, owner: str) -> bool: ...

    def schedule_create(self, schedule: Schedule, *, now: float | None = None) -> Schedule: ...

    def schedule_get(self, schedule_id: str) -> Schedule | None: ...

    def schedule_list(self) -> list[Schedule]: ...

    def schedule_delete(self, schedule_id: str) -> bool: ...

    def close(self) -> None: ...


@runtime_checkable
class Store(RunStore, AsyncAdmin, SyncCalls, Protocol):
    """Everything a worker and a client need from a store: the core run operations, the
    administration coroutines and their synchronous twins. Optional abilities (the
    doorbell, shard leases...) are not here: see ``capabilities.py``."""
