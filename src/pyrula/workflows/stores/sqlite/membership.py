"""The SQLite store's worker membership: which workers are alive and which names they
serve, so runs queued under a name nobody serves (stranded) can be found and failed."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Sequence
from typing import Any

from pyrula.workflows.records import RunStatus
from pyrula.workflows.stores.common import error_event
from pyrula.workflows.stores.sqlite.calls import Calls
from pyrula.workflows.stores.sqlite.connection import Database
from pyrula.workflows.stores.sqlite.reads import Wakeups
from pyrula.workflows.stores.sqlite.rows import append_events, end_run, from_json, to_json

logger = logging.getLogger(__name__)


class Membership:
    """register_worker, unregister_worker, stranded and fail_stranded."""

    def __init__(self, db: Database, calls: Calls, wakeups: Wakeups) -> None:
        self._db = db
        self._calls = calls
        self._wakeups = wakeups

    async def register_worker(
        self, worker_id: str, names: Sequence[str], *, now: float, ttl: float
    ) -> None:
        def op() -> None:
            with self._db.tx() as conn:
                conn.execute(
                    "INSERT INTO workers(worker_id, names, expires) VALUES (?, ?, ?) "
                    "ON CONFLICT(worker_id) DO UPDATE SET names=excluded.names, "
                    "expires=excluded.expires",
                    (worker_id, to_json(list(names)), now + ttl),
                )
                conn.executemany("INSERT OR IGNORE INTO meta(key, value) VALUES (?, '1')",
                                 [(f"served:{name}",) for name in names])

        await self._calls.call(op)

    async def unregister_worker(self, worker_id: str) -> None:
        def op() -> None:
            with self._db.tx() as conn:
                conn.execute("DELETE FROM workers WHERE worker_id=?", (worker_id,))

        await self._calls.call(op)

    async def served_names(self) -> list[str]:
        def op(conn: sqlite3.Connection) -> list[str]:
            rows = conn.execute("SELECT key FROM meta WHERE key >= 'served:' AND key < 'served;'"
                                " ORDER BY key")
            return [str(row[0])[len("served:"):] for row in rows]

        return await self._calls.call(lambda: self._db.read(op))

    async def stranded(self, *, now: float) -> list[str]:
        def op(conn: sqlite3.Connection) -> list[str]:
            served: set[str] = set()
            for row in conn.execute("SELECT names FROM workers WHERE expires>?", (now,)):
                served.update(from_json(row[0]) or [])
            queued = [r[0] for r in conn.execute(
                "SELECT DISTINCT name FROM runs WHERE status='queued'")]
            return sorted(n for n in queued if n not in served)

        return await self._calls.call(lambda: self._db.read(op))

    async def fail_stranded(
        self, name: str, *, older_than: float, now: float, limit: int, error: dict[str, Any]
    ) -> list[str]:
        def op() -> list[str]:
            with self._db.tx() as conn:
                found = conn.execute(
                    "SELECT run_id, journal_len FROM runs WHERE name=? AND status='queued' "
                    "AND updated_at<=? ORDER BY queue_seq LIMIT ?", (name, older_than, limit),
                ).fetchall()
                for run_id, length in found:
                    append_events(conn, run_id, length, [error_event(now, error)], now)
                    end_run(conn, run_id, RunStatus.FAILED, now, error=dict(error))
                return [str(r[0]) for r in found]

        failed = await self._calls.call(op)
        for run_id in failed:
            self._wakeups.notify(run_id)
        return failed
