"""SQLiteStore's administration: what an ArchivingStore reads of ended runs, worker
membership (stranded runs), flow control and schedules."""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Sequence
from typing import Any

from pyrula.workflows.records import (
    FlowControl,
    RunStatus,
)
from pyrula.workflows.schedules.schedule import Schedule
from pyrula.workflows.stores.common import (
    error_event,
    records_run,
    schedule_from_store,
    schedule_to_store,
    validate_flow_control,
)
from pyrula.workflows.stores.sqlite_base import SQLiteBase, _j, _uj


class SQLiteAdmin(SQLiteBase):

    # --- archiving (ArchivingStore) --------------------------------------------------

    async def ended_runs(
        self, *, after: tuple[float, str] | None, until: float, limit: int
    ) -> list[tuple[float, str]]:
        """(finished_at, run_id) of ended runs after the cursor ``after`` and at or before
        ``until``, oldest first, at most ``limit``."""
        low = (-math.inf, "") if after is None else (float(after[0]), str(after[1]))
        sql = (
            "SELECT finished_at, run_id FROM runs WHERE finished_at IS NOT NULL "
            "AND status IN ('completed', 'failed', 'cancelled', 'continued') "
            "AND (finished_at > ? OR (finished_at = ? AND run_id > ?)) AND finished_at <= ? "
            "ORDER BY finished_at, run_id LIMIT ?"
        )

        def op(conn: sqlite3.Connection) -> list[tuple[float, str]]:
            rows = conn.execute(sql, (low[0], low[0], low[1], until, limit)).fetchall()
            return [(float(r[0]), str(r[1])) for r in rows]

        return await self._call(lambda: self._read(op))

    async def expire_finished(self, run_ids: Sequence[str], ttl: float) -> None:
        """A no-op: the SQLite store keeps finished runs (it has no TTLs)."""
        return None

    # --- membership -----------------------------------------------------------------

    async def register_worker(
        self, worker_id: str, names: Sequence[str], *, now: float, ttl: float
    ) -> None:
        def op() -> None:
            with self._tx() as conn:
                conn.execute(
                    "INSERT INTO workers(worker_id, names, expires) VALUES (?, ?, ?) "
                    "ON CONFLICT(worker_id) DO UPDATE SET names=excluded.names, "
                    "expires=excluded.expires",
                    (worker_id, _j(list(names)), now + ttl),
                )

        await self._call(op)

    async def unregister_worker(self, worker_id: str) -> None:
        def op() -> None:
            with self._tx() as conn:
                conn.execute("DELETE FROM workers WHERE worker_id=?", (worker_id,))

        await self._call(op)

    async def stranded(self, *, now: float) -> list[str]:
        def op(conn: sqlite3.Connection) -> list[str]:
            served: set[str] = set()
            for row in conn.execute("SELECT names FROM workers WHERE expires>?", (now,)):
                served.update(_uj(row[0]) or [])
            queued = [r[0] for r in conn.execute(
                "SELECT DISTINCT name FROM runs WHERE status='queued'")]
            return sorted(n for n in queued if n not in served)

        return await self._call(lambda: self._read(op))

    async def fail_stranded(
        self, name: str, *, older_than: float, now: float, limit: int, error: dict[str, Any]
    ) -> list[str]:
        def op() -> list[str]:
            with self._tx() as conn:
                rows = conn.execute(
                    "SELECT run_id, journal_len FROM runs WHERE name=? AND status='queued' "
                    "AND updated_at<=? ORDER BY queue_seq LIMIT ?", (name, older_than, limit),
                ).fetchall()
                for run_id, length in rows:
                    self._append(conn, run_id, length, [error_event(now, error)], now)
                    self._end(conn, run_id, RunStatus.FAILED, now, error=dict(error))
                return [str(r[0]) for r in rows]

        failed = await self._call(op)
        for run_id in failed:
            self._notify_after(run_id)
        return failed

    # --- flow control ---------------------------------------------------------------

    def flow_control_set(
        self,
        owner: str,
        max_concurrent: int | None = None,
        max_starts_per_second: float | None = None,
    ) -> None:
        validate_flow_control(owner, max_concurrent, max_starts_per_second)
        with self._tx() as conn:
            conn.execute(
                "INSERT INTO flow_control(owner, max_concurrent, max_starts_per_second, tokens, "
                "stamp) VALUES (?, ?, ?, NULL, NULL) ON CONFLICT(owner) DO UPDATE SET "
                "max_concurrent=excluded.max_concurrent, "
                "max_starts_per_second=excluded.max_starts_per_second, tokens=NULL, stamp=NULL",
                (owner, max_concurrent, max_starts_per_second),
            )

    def flow_control_get(self, owner: str) -> FlowControl | None:
        row = self._read(
            lambda conn: conn.execute(
                "SELECT max_concurrent, max_starts_per_second FROM flow_control WHERE owner=?",
                (owner,),
            ).fetchone()
        )
        return None if row is None else FlowControl(owner, row[0], row[1])

    def flow_control_delete(self, owner: str) -> bool:
        with self._tx() as conn:
            return conn.execute("DELETE FROM flow_control WHERE owner=?", (owner,)).rowcount > 0

    async def aflow_control_set(
        self,
        owner: str,
        max_concurrent: int | None = None,
        max_starts_per_second: float | None = None,
    ) -> None:
        await self._call(lambda: self.flow_control_set(owner, max_concurrent,
                                                       max_starts_per_second))

    async def aflow_control_get(self, owner: str) -> FlowControl | None:
        return await self._call(lambda: self.flow_control_get(owner))

    async def aflow_control_delete(self, owner: str) -> bool:
        return await self._call(lambda: self.flow_control_delete(owner))

    # --- schedules ------------------------------------------------------------------

    _SCHEDULE_COLUMNS = "definition, paused, next_run_at, last_run_id, last_run_at"

    @staticmethod
    def _schedule(row: sqlite3.Row | tuple[Any, ...]) -> Schedule:
        definition, paused, next_run_at, last_run_id, last_run_at = tuple(row)
        return schedule_from_store(
            definition, paused=bool(paused), next_run_at=next_run_at,
            last_run_id=last_run_id, last_run_at=last_run_at,
        )

    def schedule_create(self, schedule: Schedule, *, now: float | None = None) -> Schedule:
        armed, definition = schedule_to_store(schedule, now)
        with self._tx() as conn:
            conn.execute(
                "INSERT INTO schedules(schedule_id, name, definition, paused, next_run_at) "
                "VALUES (?, ?, ?, 0, ?) ON CONFLICT(schedule_id) DO UPDATE SET "
                "name=excluded.name, definition=excluded.definition, paused=0, "
                "next_run_at=excluded.next_run_at",
                (armed.schedule_id, armed.name, definition, armed.next_run_at.timestamp()),
            )
            row = conn.execute(
                f"SELECT {self._SCHEDULE_COLUMNS} FROM schedules WHERE schedule_id=?",
                (armed.schedule_id,),
            ).fetchone()
        return self._schedule(row)

    def schedule_get(self, schedule_id: str) -> Schedule | None:
        row = self._read(lambda conn: conn.execute(
            f"SELECT {self._SCHEDULE_COLUMNS} FROM schedules WHERE schedule_id=?",
            (schedule_id,),
        ).fetchone())
        return None if row is None else self._schedule(row)

    def schedule_list(self) -> list[Schedule]:
        rows = self._read(lambda conn: conn.execute(
            f"SELECT {self._SCHEDULE_COLUMNS} FROM schedules ORDER BY schedule_id"
        ).fetchall())
        return [self._schedule(r) for r in rows]

    def schedule_delete(self, schedule_id: str) -> bool:
        with self._tx() as conn:
            deleted = conn.execute("DELETE FROM schedules WHERE schedule_id=?", (schedule_id,))
            return deleted.rowcount > 0

    async def aschedule_create(
        self, schedule: Schedule, *, now: float | None = None
    ) -> Schedule:
        return await self._call(lambda: self.schedule_create(schedule, now=now))

    async def aschedule_get(self, schedule_id: str) -> Schedule | None:
        return await self._call(lambda: self.schedule_get(schedule_id))

    async def aschedule_list(self) -> list[Schedule]:
        return await self._call(self.schedule_list)

    async def aschedule_delete(self, schedule_id: str) -> bool:
        return await self._call(lambda: self.schedule_delete(schedule_id))

    async def schedules_due(
        self, names: Sequence[str], *, now: float, limit: int
    ) -> list[Schedule]:
        if not names or limit <= 0:
            return []
        sql = (
            f"SELECT {self._SCHEDULE_COLUMNS} FROM schedules WHERE paused=0 AND "
            f"next_run_at<=? AND name IN ({','.join('?' * len(names))}) "
            "ORDER BY next_run_at, schedule_id LIMIT ?"
        )
        args = [now, *names, limit]

        def op(conn: sqlite3.Connection) -> list[Schedule]:
            return [self._schedule(r) for r in conn.execute(sql, args).fetchall()]

        return await self._call(lambda: self._read(op))

    async def schedule_advance(
        self,
        schedule_id: str,
        *,
        expected_next_run_at: float | None,
        next_run_at: float | None,
        run_id: str | None = None,
        run_at: float | None = None,
    ) -> bool:
        def op() -> bool:
            with self._tx() as conn:
                row = conn.execute(
                    "SELECT next_run_at, last_run_at FROM schedules WHERE schedule_id=?",
                    (schedule_id,),
                ).fetchone()
                if row is None:
                    return False
                if records_run(row[1], run_id, run_at):
                    conn.execute(
                        "UPDATE schedules SET last_run_id=?, last_run_at=? WHERE schedule_id=?",
                        (run_id, run_at, schedule_id),
                    )
                if expected_next_run_at is None or next_run_at is None:
                    return False
                if row[0] != expected_next_run_at:
                    return False
                conn.execute(
                    "UPDATE schedules SET next_run_at=? WHERE schedule_id=?",
                    (next_run_at, schedule_id),
                )
                return True

        return await self._call(op)

    async def schedule_set_paused(
        self, schedule_id: str, paused: bool, *, next_run_at: float | None = None
    ) -> bool:
        def op() -> bool:
            with self._tx() as conn:
                changed = conn.execute(
                    "UPDATE schedules SET paused=?, next_run_at=COALESCE(?, next_run_at) "
                    "WHERE schedule_id=?",
                    (1 if paused else 0, next_run_at, schedule_id),
                )
                return changed.rowcount > 0

        return await self._call(op)

