"""SQLiteStore: the store protocol over one SQLite file, each concern answered by one part.

The parts share one :class:`~pyrula.workflows.stores.sqlite.connection.Database` (the
connection and its transactions) and one
:class:`~pyrula.workflows.stores.sqlite.calls.Calls` (where a call runs); this class
only builds them and hands each operation to its part. The synchronous administration
calls come from :class:`~pyrula.workflows.stores.admin.SyncAdmin`, driven on the
caller's thread (``sync_driven``: under ``SYNC_DRIVE`` a call runs at once there).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Collection, Mapping, Sequence
from typing import Any, ClassVar, Self
from urllib.parse import parse_qs, urlsplit

from pyrula.workflows.errors import ConfigurationError
from pyrula.workflows.events import Event
from pyrula.workflows.limits import LimitKeys, WorkflowLimits
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
from pyrula.workflows.stores.admin import SyncAdmin
from pyrula.workflows.stores.capabilities import ProjectionHead, QueueStat
from pyrula.workflows.stores.sqlite.attempts import Attempts
from pyrula.workflows.stores.sqlite.calls import Calls
from pyrula.workflows.stores.sqlite.connection import Database
from pyrula.workflows.stores.sqlite.control import RunControl
from pyrula.workflows.stores.sqlite.flow import FlowLimits
from pyrula.workflows.stores.sqlite.limits import SQLiteLimits
from pyrula.workflows.stores.sqlite.membership import Membership
from pyrula.workflows.stores.sqlite.projections import SQLiteProjections
from pyrula.workflows.stores.sqlite.queue import WorkQueue
from pyrula.workflows.stores.sqlite.reads import Reads, Wakeups
from pyrula.workflows.stores.sqlite.schedules import Schedules
from pyrula.workflows.stores.sqlite.triggers import EventTriggers

logger = logging.getLogger(__name__)


class SQLiteStore(SyncAdmin):
    """A store in one SQLite file (WAL). ``SQLiteStore(path)``; ``:memory:`` is refused
    because it cannot be shared — use MemoryStore for that.

    The file is created when it does not exist, as a worker or a fleet wants. A script
    that only submits to or reads a fleet's store passes ``create=False``: opened from
    another directory, a relative path would name a new, empty store that no worker reads
    (its runs would wait forever), so a missing file is refused instead, naming it."""

    #: Every call's body is synchronous: under SYNC_DRIVE it runs on the caller's thread.
    sync_driven: ClassVar[bool] = True

    def __init__(
        self,
        path: str | os.PathLike[str] = "pyrula.db",
        *,
        busy_timeout: float = 30.0,
        synchronous: str = "NORMAL",
        create: bool = True,
    ) -> None:
        if not create and not os.path.exists(path):
            raise ConfigurationError(
                f"no store at {os.path.abspath(path)}: open the file your fleet or worker "
                "runs on (SQLiteStore(create=False) opens an existing store only)")
        self._db = db = Database(
            os.fspath(path), busy_timeout=busy_timeout, synchronous=synchronous
        )
        self.path = db.path
        self._calls = calls = Calls(db)
        wakeups = Wakeups()
        self._limits = SQLiteLimits(db, calls)
        self._queue = WorkQueue(db, calls, self._limits)
        self._attempts = Attempts(db, calls, wakeups)
        self._reads = Reads(db, calls, wakeups)
        self._control = RunControl(db, calls, wakeups)
        self._membership = Membership(db, calls, wakeups)
        self._flow = FlowLimits(db, calls)
        self._schedules = Schedules(db, calls)
        self._triggers = EventTriggers(db, calls)
        self._projections = SQLiteProjections(db, calls)
        db.connection()  # fail fast on an unusable path

    @classmethod
    def from_url(cls, url: str, **options: Any) -> Self:
        """``sqlite:///relative.db``, ``sqlite:////absolute/path.db``; the query may set
        ``synchronous`` (``?synchronous=FULL``: commits survive a power loss too)."""
        from pyrula.config.store_url import sqlite_file

        parts = urlsplit(url)
        path = sqlite_file(url)
        if path is None:
            raise ConfigurationError(f"store URL {url!r} is not a SQLite URL")
        for key, values in parse_qs(parts.query, keep_blank_values=True).items():
            if key != "synchronous":
                raise ConfigurationError(
                    f"store URL {url!r}: unknown option {key!r} (a SQLite URL takes "
                    "?synchronous=OFF|NORMAL|FULL|EXTRA)")
            options.setdefault("synchronous", values[-1])
        return cls(path, **options)

    # --- work queue -----------------------------------------------------------------

    async def submit(
        self, name: str, params: Any, *, now: float, owner: str | None = None,
        idempotency_key: str | None = None, priority: int = 0,
        limit_keys: LimitKeys | None = None,
    ) -> tuple[RunHandle, bool]:
        return await self._queue.submit(
            name, params, now=now, owner=owner, idempotency_key=idempotency_key,
            priority=priority, limit_keys=limit_keys,
        )

    # --- per-key concurrency limits and rates (KeyedLimits) ---------------------------

    def use_limits(self, limits: Mapping[str, WorkflowLimits]) -> None:
        self._limits.use_limits(limits)

    async def assign_limit_keys(
        self, run_id: str, token: int, keys: LimitKeys, *, now: float
    ) -> bool:
        return await self._limits.assign_limit_keys(run_id, token, keys, now=now)

    async def claim(
        self, worker_id: str, names: Sequence[str], *, limit: int, now: float, lock_ttl: float,
        build: str | None = None,
    ) -> Claimed:
        return await self._queue.claim(worker_id, names, limit=limit, now=now, lock_ttl=lock_ttl,
                                       build=build)

    async def claim_suspect(
        self, worker_id: str, at: Sequence[SuspectsAt], *, now: float, lock_ttl: float,
        build: str | None = None,
    ) -> ClaimedRun | None:
        return await self._queue.claim_suspect(worker_id, at, now=now, lock_ttl=lock_ttl,
                                               build=build)

    async def claim_run(
        self, run_id: str, worker_id: str, *, now: float, lock_ttl: float,
        build: str | None = None,
    ) -> ClaimedRun | None:
        return await self._queue.claim_run(run_id, worker_id, now=now, lock_ttl=lock_ttl,
                                           build=build)

    async def wake_due(self, *, now: float, limit: int) -> int:
        return await self._queue.wake_due(now=now, limit=limit)

    async def queue_stats(self, names: Sequence[str]) -> dict[str, QueueStat]:
        return await self._queue.queue_stats(names)

    # --- attempts -------------------------------------------------------------------

    async def append(
        self, run_id: str, token: int, events: Sequence[Event], *, now: float, lock_ttl: float
    ) -> AppendResult:
        return await self._attempts.append(run_id, token, events, now=now, lock_ttl=lock_ttl)

    async def park(
        self, run_id: str, token: int, events: Sequence[Event], *, now: float,
        wake_at: float | None, signals: Sequence[str], known_seq: int, interrupt: Any = None,
    ) -> ParkResult:
        return await self._attempts.park(
            run_id, token, events, now=now, wake_at=wake_at, signals=signals,
            known_seq=known_seq, interrupt=interrupt,
        )

    async def finish(
        self, run_id: str, token: int, events: Sequence[Event], *, now: float,
        status: RunStatus, result: Any = None, error: dict[str, Any] | None = None,
        successor_params: Any = None,
    ) -> FinishResult:
        return await self._attempts.finish(
            run_id, token, events, now=now, status=status, result=result, error=error,
            successor_params=successor_params,
        )

    async def requeue(
        self, run_id: str, token: int, *, now: float, reason: str, events: Sequence[Event] = (),
        crash: bool = False, poison: PoisonPolicy | None = None,
        crash_detail: Mapping[str, Any] | None = None,
    ) -> RequeueOutcome:
        return await self._attempts.requeue(
            run_id, token, now=now, reason=reason, events=events, crash=crash, poison=poison,
            crash_detail=crash_detail,
        )

    async def renew(
        self, worker_id: str, held: Mapping[str, int], *, now: float, lock_ttl: float
    ) -> RenewResult:
        return await self._attempts.renew(worker_id, held, now=now, lock_ttl=lock_ttl)

    async def reclaim(
        self, names: Sequence[str] | None, *, now: float, limit: int, poison: PoisonPolicy
    ) -> list[RequeueOutcome]:
        return await self._attempts.reclaim(names, now=now, limit=limit, poison=poison)

    async def reclaim_worker(
        self, worker_id: str, *, now: float, poison: PoisonPolicy,
        crash_detail: Mapping[str, Any] | None = None, charge: Collection[str] | None = None,
    ) -> list[RequeueOutcome]:
        return await self._attempts.reclaim_worker(
            worker_id, now=now, poison=poison, crash_detail=crash_detail, charge=charge
        )

    async def requeue_unheld(
        self, worker_id: str, held: Collection[str], *, now: float
    ) -> list[RequeueOutcome]:
        return await self._attempts.requeue_unheld(worker_id, held, now=now)

    # --- run control ----------------------------------------------------------------

    async def signal(self, run_id: str, name: str, payload: Any, *, now: float) -> None:
        await self._control.signal(run_id, name, payload, now=now)

    async def nudge(self, run_id: str, *, now: float) -> None:
        await self._control.nudge(run_id, now=now)

    async def cancel(self, run_id: str, *, now: float) -> bool:
        return await self._control.cancel(run_id, now=now)

    async def wake_run(self, run_id: str, *, now: float) -> bool:
        return await self._control.wake_run(run_id, now=now)

    # --- reads ----------------------------------------------------------------------

    async def get_run(self, run_id: str) -> RunInfo | None:
        return await self._reads.get_run(run_id)

    async def read_events(self, run_id: str, after_seq: int = 0) -> list[Event]:
        return await self._reads.read_events(run_id, after_seq)

    async def list_runs(
        self, *, name: str | None = None, status: RunStatus | None = None,
        owner: str | None = None, limit: int = 100, before: tuple[float, str] | None = None,
    ) -> list[RunInfo]:
        return await self._reads.list_runs(
            name=name, status=status, owner=owner, limit=limit, before=before
        )

    async def wait_result(self, run_id: str, timeout: float | None) -> RunInfo:
        return await self._reads.wait_result(run_id, timeout)

    async def ended_runs(
        self, *, after: tuple[float, str] | None, until: float, limit: int
    ) -> list[tuple[float, str]]:
        return await self._reads.ended_runs(after=after, until=until, limit=limit)

    async def expire_finished(self, run_ids: Sequence[str], ttl: float) -> None:
        await self._reads.expire_finished(run_ids, ttl)

    # --- membership -----------------------------------------------------------------

    async def register_worker(
        self, worker_id: str, names: Sequence[str], *, now: float, ttl: float
    ) -> None:
        await self._membership.register_worker(worker_id, names, now=now, ttl=ttl)

    async def unregister_worker(self, worker_id: str) -> None:
        await self._membership.unregister_worker(worker_id)

    async def stranded(self, *, now: float) -> list[str]:
        return await self._membership.stranded(now=now)

    async def served_names(self) -> list[str]:
        return await self._membership.served_names()

    async def fail_stranded(
        self, name: str, *, older_than: float, now: float, limit: int, error: dict[str, Any]
    ) -> list[str]:
        return await self._membership.fail_stranded(
            name, older_than=older_than, now=now, limit=limit, error=error
        )

    # --- administration (the sync twins come from SyncAdmin) ------------------------

    async def aping(self) -> None:
        await self._calls.call(
            lambda: self._db.read(lambda conn: conn.execute("SELECT 1").fetchone())
        )

    async def arecover_pending_runs(self, name: str) -> int:
        return len(await self._attempts.reclaim(
            [name], now=time.time(), limit=1 << 30, poison=PoisonPolicy()
        ))

    async def aflow_control_set(
        self, owner: str, max_concurrent: int | None = None,
        max_starts_per_second: float | None = None,
    ) -> None:
        await self._flow.aflow_control_set(owner, max_concurrent, max_starts_per_second)

    async def aflow_control_get(self, owner: str) -> FlowControl | None:
        return await self._flow.aflow_control_get(owner)

    async def aflow_control_delete(self, owner: str) -> bool:
        return await self._flow.aflow_control_delete(owner)

    async def aschedule_create(self, schedule: Schedule, *, now: float | None = None) -> Schedule:
        return await self._schedules.aschedule_create(schedule, now=now)

    async def aschedule_get(self, schedule_id: str) -> Schedule | None:
        return await self._schedules.aschedule_get(schedule_id)

    async def aschedule_list(self) -> list[Schedule]:
        return await self._schedules.aschedule_list()

    async def aschedule_delete(self, schedule_id: str) -> bool:
        return await self._schedules.aschedule_delete(schedule_id)

    async def schedules_due(
        self, names: Sequence[str], *, now: float, limit: int
    ) -> list[Schedule]:
        return await self._schedules.schedules_due(names, now=now, limit=limit)

    async def schedule_advance(
        self, schedule_id: str, *, expected_next_run_at: float | None,
        next_run_at: float | None, run_id: str | None = None, run_at: float | None = None,
    ) -> bool:
        return await self._schedules.schedule_advance(
            schedule_id, expected_next_run_at=expected_next_run_at, next_run_at=next_run_at,
            run_id=run_id, run_at=run_at,
        )

    async def schedule_set_paused(
        self, schedule_id: str, paused: bool, *, next_run_at: float | None = None
    ) -> bool:
        return await self._schedules.schedule_set_paused(
            schedule_id, paused, next_run_at=next_run_at
        )

    # --- events and batch triggers (Triggers) ----------------------------------------

    async def emit(
        self, topic: str, payload: Any, *, now: float, key: str | None = None,
        owner: str | None = None,
    ) -> tuple[str, bool]:
        return await self._triggers.emit(topic, payload, now=now, key=key, owner=owner)

    async def take_batches(
        self, name: str, topic: str, *, max_size: int, max_wait: float, now: float,
        limit: int,
    ) -> list[RunHandle]:
        return await self._triggers.take_batches(
            name, topic, max_size=max_size, max_wait=max_wait, now=now, limit=limit
        )

    # --- projections (Projections) ---------------------------------------------------

    async def ended_infos(
        self, names: Sequence[str], *, after: tuple[float, str] | None, until: float,
        limit: int,
    ) -> list[RunInfo]:
        return await self._projections.ended_infos(names, after=after, until=until,
                                                   limit=limit)

    async def projection_head(self, name: str) -> ProjectionHead | None:
        return await self._projections.projection_head(name)

    async def projection_heads(self) -> list[ProjectionHead]:
        return await self._projections.projection_heads()

    async def projection_states(self, name: str, keys: Sequence[str] | None
                                ) -> dict[str, Any]:
        return await self._projections.projection_states(name, keys)

    async def save_projection(
        self, head: ProjectionHead, states: Mapping[str, Any], *, expected: int,
        reset: bool,
    ) -> bool:
        return await self._projections.save_projection(head, states, expected=expected,
                                                       reset=reset)

    async def reset_projection(self, name: str, *, now: float) -> bool:
        return await self._projections.reset_projection(name, now=now)

    # --- lifecycle ------------------------------------------------------------------

    async def bind(
        self, project: str | None, environment: str | None
    ) -> tuple[str | None, str | None]:
        def op() -> tuple[str | None, str | None]:
            with self._db.tx() as conn:
                recorded: list[str | None] = []
                for key, value in (("project", project), ("environment", environment)):
                    if value is not None:
                        conn.execute(
                            "INSERT OR IGNORE INTO meta(key, value) VALUES (?, ?)",
                            (f"binding.{key}", value),
                        )
                    row = conn.execute(
                        "SELECT value FROM meta WHERE key=?", (f"binding.{key}",)
                    ).fetchone()
                    recorded.append(None if row is None else str(row[0]))
                return recorded[0], recorded[1]

        return await self._calls.call(op)

    def close(self) -> None:
        """Finish the calls in flight and close the connection. The store stays usable:
        a later call reopens it (a stopping worker closes it while others may use it)."""
        self._calls.stop()
        self._db.close()

    async def aclose(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.close)

    def __repr__(self) -> str:
        return f"SQLiteStore({os.path.abspath(self.path)!r})"
