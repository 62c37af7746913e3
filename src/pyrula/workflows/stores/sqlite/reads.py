"""The SQLite store's reads: a run, its journal, a page of runs, waiting for a run's end
(ended in this process or in another), and what an ArchivingStore reads of ended runs."""

from __future__ import annotations

import logging
import math
import sqlite3
from collections.abc import Sequence
from typing import Any

from pyrula.workflows.errors import WorkflowNotFound
from pyrula.workflows.events import Event
from pyrula.workflows.records import RunInfo, RunStatus
from pyrula.workflows.stores.sqlite import rows
from pyrula.workflows.stores.sqlite.calls import Calls
from pyrula.workflows.stores.sqlite.connection import Database
from pyrula.workflows.stores.waiters import EndWatch, ResultWaiters

logger = logging.getLogger(__name__)


class Reads:
    """get_run, read_events, list_runs, wait_result, ended_runs, expire_finished."""

    #: The longest a result waiter's loop goes without looking whether runs it waits for
    #: ended in another process (seconds); it looks every 5 ms while ends keep coming.
    RESULT_POLL_MAX = 0.25
    #: How often each waiter also re-checks its own run (a safety net under EndWatch).
    RESULT_CHECK_S = 1.0

    def __init__(self, db: Database, calls: Calls, waiters: ResultWaiters) -> None:
        self._db = db
        self._calls = calls
        self._waiters = waiters
        #: This process's lookups of the runs its waiters wait for, one per loop and round.
        self.ends = EndWatch(waiters, self._ended_among, self.RESULT_POLL_MAX)

    async def get_run(self, run_id: str) -> RunInfo | None:
        def op(conn: sqlite3.Connection) -> RunInfo | None:
            row = rows.row(conn, run_id)
            return None if row is None else rows.info(row)

        return await self._calls.call(lambda: self._db.read(op), inline=True)

    async def read_events(self, run_id: str, after_seq: int = 0) -> list[Event]:
        def op(conn: sqlite3.Connection) -> list[Event]:
            rows.require(conn, run_id)
            return rows.journal(conn, run_id, after_seq)

        return await self._calls.call(lambda: self._db.read(op))

    async def list_runs(
        self,
        *,
        name: str | None = None,
        status: RunStatus | None = None,
        owner: str | None = None,
        limit: int = 100,
        before: tuple[float, str] | None = None,
    ) -> list[RunInfo]:
        clauses: list[str] = []
        args: list[Any] = []
        if name is not None:
            clauses.append("name=?")
            args.append(name)
        if status is not None:
            clauses.append("status=?")
            args.append(RunStatus(status).value)
        if owner is not None:
            clauses.append("owner=?")
            args.append(owner)
        if before is not None:
            clauses.append("(created_at < ? OR (created_at = ? AND run_id < ?))")
            args.extend([before[0], before[0], before[1]])
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        sql = (
            f"SELECT {rows.RUN_COLUMNS} FROM runs {where} "
            "ORDER BY created_at DESC, run_id DESC LIMIT ?"
        )
        args.append(limit)

        def op(conn: sqlite3.Connection) -> list[RunInfo]:
            return [rows.info(r) for r in conn.execute(sql, args).fetchall()]

        return await self._calls.call(lambda: self._db.read(op))

    async def wait_result(self, run_id: str, timeout: float | None) -> RunInfo:
        async def check(rid: str) -> RunInfo | None:
            info = self.ends.found(rid)
            if info is None:
                info = await self.get_run(rid)
            if info is None:
                raise WorkflowNotFound(f"no run with id {rid!r}")
            return info if info.status.terminal else None

        # Other processes finish runs too: this loop's EndWatch looks them up together,
        # and each waiter re-checks on its own only every RESULT_CHECK_S.
        with self.ends.watching(run_id):
            return await self._waiters.wait(
                run_id, check, timeout, poll=self.RESULT_CHECK_S, first_poll=self.RESULT_CHECK_S
            )

    async def _ended_among(self, run_ids: list[str]) -> dict[str, RunInfo]:
        """Those of ``run_ids`` that have ended (one query per 500 of them)."""

        def op(conn: sqlite3.Connection) -> dict[str, RunInfo]:
            ended: dict[str, RunInfo] = {}
            for i in range(0, len(run_ids), 500):
                chunk = run_ids[i:i + 500]
                for row in conn.execute(
                    f"SELECT {rows.RUN_COLUMNS} FROM runs WHERE run_id IN "
                    f"({','.join('?' * len(chunk))}) AND status IN ({rows.TERMINAL})", chunk,
                ):
                    ended[row["run_id"]] = rows.info(row)
            return ended

        return await self._calls.call(lambda: self._db.read(op), inline=True)

    # --- archiving (ArchivingStore) --------------------------------------------------

    async def ended_runs(
        self, *, after: tuple[float, str] | None, until: float, limit: int
    ) -> list[tuple[float, str]]:
        """(finished_at, run_id) of ended runs after the cursor ``after`` and at or before
        ``until``, oldest first, at most ``limit``."""
        low = (-math.inf, "") if after is None else (float(after[0]), str(after[1]))
        sql = (
            "SELECT finished_at, run_id FROM runs WHERE finished_at IS NOT NULL "
            f"AND status IN ({rows.TERMINAL}) "
            "AND (finished_at > ? OR (finished_at = ? AND run_id > ?)) AND finished_at <= ? "
            "ORDER BY finished_at, run_id LIMIT ?"
        )

        def op(conn: sqlite3.Connection) -> list[tuple[float, str]]:
            found = conn.execute(sql, (low[0], low[0], low[1], until, limit)).fetchall()
            return [(float(r[0]), str(r[1])) for r in found]

        return await self._calls.call(lambda: self._db.read(op))

    async def expire_finished(self, run_ids: Sequence[str], ttl: float) -> None:
        """A no-op: the SQLite store keeps finished runs (it has no TTLs)."""
        return None
