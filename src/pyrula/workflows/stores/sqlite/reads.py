"""The SQLite store's reads: a run, its journal, a page of runs, waiting for a run's end
(ended in this process or in another), and what an ArchivingStore reads of ended runs.

A wait for a run's end has two forms: on an event loop, a future woken by this process's
writes (:class:`~pyrula.workflows.stores.waiters.ResultWaiters`) with the loop's
:class:`~pyrula.workflows.stores.waiters.EndWatch` looking up ends in other processes;
under ``SYNC_DRIVE`` (a synchronous caller's thread, no loop) the thread itself sleeps on
:class:`Wakeups` between looks at its run, so the call never suspends.
"""

from __future__ import annotations

import logging
import math
import sqlite3
import threading
import time
from collections.abc import Sequence
from typing import Any

from pyrula.workflows._sync import SYNC_DRIVE
from pyrula.workflows.errors import WorkflowNotFound
from pyrula.workflows.events import Event
from pyrula.workflows.records import RunInfo, RunStatus
from pyrula.workflows.stores.sqlite.calls import Calls
from pyrula.workflows.stores.sqlite.connection import Database
from pyrula.workflows.stores.sqlite.rows import (
    RUN_COLUMNS,
    TERMINAL,
    read_journal,
    require_run,
    run_info,
    run_row,
)
from pyrula.workflows.stores.waiters import EndWatch, ResultWaiters

logger = logging.getLogger(__name__)


class Wakeups:
    """Tells this process's waiters that a run may have ended: those on event loops (by
    run id) and the threads blocked in a synchronous wait (all of them: each looks at its
    own run again)."""

    def __init__(self) -> None:
        self.waiters = ResultWaiters()
        self._changed = threading.Condition()
        self._generation = 0

    def notify(self, run_id: str) -> None:
        self.waiters.notify(run_id)
        with self._changed:
            self._generation += 1
            self._changed.notify_all()

    def generation(self) -> int:
        with self._changed:
            return self._generation

    def sleep(self, seen: int, seconds: float) -> None:
        """Block this thread until a notify after ``generation() == seen``, or ``seconds``."""
        with self._changed:
            self._changed.wait_for(lambda: self._generation != seen, seconds)


class Reads:
    """get_run, read_events, list_runs, wait_result, ended_runs, expire_finished."""

    #: The longest a result waiter goes without looking whether the runs it waits for
    #: ended in another process (seconds): from 5 ms, doubling while none did, so a
    #: result is seen at most this late, or twice as late as it came for a quicker run.
    #: (At 0.25 s a script's first result from a fleet started ~170 ms earlier came back
    #: at ~320 ms; a look is one indexed query.)
    RESULT_POLL_MAX = 0.05
    #: How often each waiter also re-checks its own run (a safety net under EndWatch).
    RESULT_CHECK_S = 1.0

    def __init__(self, db: Database, calls: Calls, wakeups: Wakeups) -> None:
        self._db = db
        self._calls = calls
        self._wakeups = wakeups
        #: This process's lookups of the runs its waiters wait for, one per loop and round.
        self.ends = EndWatch(wakeups.waiters, self._ended_among, self.RESULT_POLL_MAX)

    async def get_run(self, run_id: str) -> RunInfo | None:
        return await self._calls.call(lambda: self._get(run_id), inline=True)

    def _get(self, run_id: str) -> RunInfo | None:
        def op(conn: sqlite3.Connection) -> RunInfo | None:
            row = run_row(conn, run_id)
            return None if row is None else run_info(row)

        return self._db.read(op)

    async def read_events(self, run_id: str, after_seq: int = 0) -> list[Event]:
        def op(conn: sqlite3.Connection) -> list[Event]:
            require_run(conn, run_id)
            return read_journal(conn, run_id, after_seq)

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
            f"SELECT {RUN_COLUMNS} FROM runs {where} "
            "ORDER BY created_at DESC, run_id DESC LIMIT ?"
        )
        args.append(limit)

        def op(conn: sqlite3.Connection) -> list[RunInfo]:
            return [run_info(r) for r in conn.execute(sql, args).fetchall()]

        return await self._calls.call(lambda: self._db.read(op))

    async def wait_result(self, run_id: str, timeout: float | None) -> RunInfo:
        if SYNC_DRIVE.get():
            return self._wait_on_this_thread(run_id, timeout)

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
            return await self._wakeups.waiters.wait(
                run_id, check, timeout, poll=self.RESULT_CHECK_S, first_poll=self.RESULT_CHECK_S
            )

    def _wait_on_this_thread(self, run_id: str, timeout: float | None) -> RunInfo:
        """wait_result on a synchronous caller's thread: look at the run, then sleep until
        this process ends a run or, for ends in other processes, a while (from 5 ms,
        doubling up to RESULT_POLL_MAX as the run goes on)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        interval = EndWatch.MIN_INTERVAL
        while True:
            seen = self._wakeups.generation()  # before the look: a notify then is not lost
            info = self._get(run_id)
            if info is None:
                raise WorkflowNotFound(f"no run with id {run_id!r}")
            if info.status.terminal:
                return info
            wait = interval
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"run {run_id} did not end within {timeout} s")
                wait = min(wait, left)
            self._wakeups.sleep(seen, wait)
            interval = min(self.RESULT_POLL_MAX, interval * 2)

    async def _ended_among(self, run_ids: list[str]) -> dict[str, RunInfo]:
        """Those of ``run_ids`` that have ended (one query per 500 of them)."""

        def op(conn: sqlite3.Connection) -> dict[str, RunInfo]:
            ended: dict[str, RunInfo] = {}
            for i in range(0, len(run_ids), 500):
                chunk = run_ids[i:i + 500]
                for row in conn.execute(
                    f"SELECT {RUN_COLUMNS} FROM runs WHERE run_id IN "
                    f"({','.join('?' * len(chunk))}) AND status IN ({TERMINAL})", chunk,
                ):
                    ended[row["run_id"]] = run_info(row)
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
            f"AND status IN ({TERMINAL}) "
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
