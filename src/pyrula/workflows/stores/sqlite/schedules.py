"""The SQLite store's schedules: an operator's records (create, get, list, delete) and
what the scheduler loop does with them (the due ones, advancing one, pausing one)."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Sequence
from typing import Any

from pyrula.workflows.schedules.schedule import Schedule
from pyrula.workflows.stores.common import records_run, schedule_from_store, schedule_to_store
from pyrula.workflows.stores.sqlite.calls import Calls
from pyrula.workflows.stores.sqlite.connection import Database

logger = logging.getLogger(__name__)

_COLUMNS = "definition, paused, next_run_at, last_run_id, last_run_at"


def _schedule(row: sqlite3.Row | tuple[Any, ...]) -> Schedule:
    definition, paused, next_run_at, last_run_id, last_run_at = tuple(row)
    return schedule_from_store(
        definition, paused=bool(paused), next_run_at=next_run_at,
        last_run_id=last_run_id, last_run_at=last_run_at,
    )


class Schedules:
    """The schedule operations of the store protocol."""

    def __init__(self, db: Database, calls: Calls) -> None:
        self._db = db
        self._calls = calls

    async def aschedule_create(
        self, schedule: Schedule, *, now: float | None = None
    ) -> Schedule:
        armed, definition = schedule_to_store(schedule, now)

        def op() -> Schedule:
            with self._db.tx() as conn:
                conn.execute(
                    "INSERT INTO schedules(schedule_id, name, definition, paused, next_run_at) "
                    "VALUES (?, ?, ?, 0, ?) ON CONFLICT(schedule_id) DO UPDATE SET "
                    "name=excluded.name, definition=excluded.definition, paused=0, "
                    "next_run_at=excluded.next_run_at",
                    (armed.schedule_id, armed.name, definition, armed.next_run_at.timestamp()),
                )
                row = conn.execute(
                    f"SELECT {_COLUMNS} FROM schedules WHERE schedule_id=?",
                    (armed.schedule_id,),
                ).fetchone()
            return _schedule(row)

        return await self._calls.call(op)

    async def aschedule_get(self, schedule_id: str) -> Schedule | None:
        row = await self._calls.call(lambda: self._db.read(lambda conn: conn.execute(
            f"SELECT {_COLUMNS} FROM schedules WHERE schedule_id=?", (schedule_id,),
        ).fetchone()))
        return None if row is None else _schedule(row)

    async def aschedule_list(self) -> list[Schedule]:
        found = await self._calls.call(lambda: self._db.read(lambda conn: conn.execute(
            f"SELECT {_COLUMNS} FROM schedules ORDER BY schedule_id"
        ).fetchall()))
        return [_schedule(r) for r in found]

    async def aschedule_delete(self, schedule_id: str) -> bool:
        def op() -> bool:
            with self._db.tx() as conn:
                deleted = conn.execute("DELETE FROM schedules WHERE schedule_id=?", (schedule_id,))
                return deleted.rowcount > 0

        return await self._calls.call(op)

    async def schedules_due(
        self, names: Sequence[str], *, now: float, limit: int
    ) -> list[Schedule]:
        if not names or limit <= 0:
            return []
        sql = (
            f"SELECT {_COLUMNS} FROM schedules WHERE paused=0 AND "
            f"next_run_at<=? AND name IN ({','.join('?' * len(names))}) "
            "ORDER BY next_run_at, schedule_id LIMIT ?"
        )
        args = [now, *names, limit]

        def op(conn: sqlite3.Connection) -> list[Schedule]:
            return [_schedule(r) for r in conn.execute(sql, args).fetchall()]

        return await self._calls.call(lambda: self._db.read(op))

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
            with self._db.tx() as conn:
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

        return await self._calls.call(op)

    async def schedule_set_paused(
        self, schedule_id: str, paused: bool, *, next_run_at: float | None = None
    ) -> bool:
        def op() -> bool:
            with self._db.tx() as conn:
                changed = conn.execute(
                    "UPDATE schedules SET paused=?, next_run_at=COALESCE(?, next_run_at) "
                    "WHERE schedule_id=?",
                    (1 if paused else 0, next_run_at, schedule_id),
                )
                return changed.rowcount > 0

        return await self._calls.call(op)
