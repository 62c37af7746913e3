"""The SQLite store's work queue: submitting runs, claiming them (fair across owners,
within their flow-control limits; put-aside suspects one at a time), waking those whose
timer fell due, and the queues' depth and age (QueueStats).

A queued suspect has no ``queue_seq`` (so the ordinary claim's reads, all by queue_seq,
never see it) and a ``suspect_seq``, its place among its name's suspects."""

from __future__ import annotations

import logging
import sqlite3
from collections import deque
from collections.abc import Sequence
from typing import Any

from pyrula.workflows.errors import JournalCorrupt, WorkflowNotFound
from pyrula.workflows.events import Event, EventType, make_event
from pyrula.workflows.limits import LimitKeys
from pyrula.workflows.priority import MAX_PRIORITY, check_priority
from pyrula.workflows.records import Claimed, ClaimedRun, RunHandle, RunStatus, SuspectsAt
from pyrula.workflows.stores.capabilities import QueueStat
from pyrula.workflows.stores.common import NO_OWNER, pick_owner, record_params, started_event
from pyrula.workflows.stores.sqlite.calls import Calls
from pyrula.workflows.stores.sqlite.connection import Database
from pyrula.workflows.stores.sqlite.flow import flow_allows
from pyrula.workflows.stores.sqlite.limits import SQLiteLimits
from pyrula.workflows.stores.sqlite.rows import (
    append_events,
    enqueue,
    from_json,
    insert_events,
    new_run,
    read_journal,
)

logger = logging.getLogger(__name__)

#: Claims of at most this many runs may run on the caller's event loop (see Calls.call).
_INLINE_CLAIM = 64


class WorkQueue:
    """submit, claim, claim_run and wake_due of the store protocol, and queue_stats."""

    def __init__(self, db: Database, calls: Calls, limits: SQLiteLimits) -> None:
        self._db = db
        self._calls = calls
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
        """One transaction: the idempotency check and the new run, queued by
        ``priority`` among its owner's runs (or, with ``limit_keys``, in its key's
        waiting line)."""
        priority = check_priority(priority)

        def op() -> tuple[RunHandle, bool]:
            with self._db.tx() as conn:
                if idempotency_key is not None:
                    row = conn.execute(
                        "SELECT run_id FROM runs WHERE name=? AND idempotency_key=?",
                        (name, idempotency_key),
                    ).fetchone()
                    if row is not None:
                        return RunHandle(name, row[0]), False
                run_id = new_run(
                    conn, name, params, owner or NO_OWNER, now, idempotency_key, None,
                    priority=priority, limit_keys=limit_keys,
                )
                return RunHandle(name, run_id), True

        return await self._calls.call(op, inline=True)

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
        def op() -> Claimed:
            claimed: list[ClaimedRun] = []
            with self._db.tx() as conn:
                flow = conn.execute("SELECT 1 FROM flow_control LIMIT 1").fetchone() is not None
                if self._limits.limits:
                    self._limits.admit(conn, names, now)
                queues = [_NameQueue(conn, name, limit) for name in names]
                blocked: set[str] = set()
                progress = True
                while len(claimed) < limit and progress:
                    progress = False
                    for queue in queues:
                        if len(claimed) >= limit:
                            break
                        run_id = _pick(conn, queue, now, blocked, flow)
                        if run_id is None:
                            continue
                        progress = True
                        claimed.append(_take(conn, run_id, worker_id, now, lock_ttl, build))
                for queue in queues:
                    queue.record_served()
                waiting = [SuspectsAt(n) for n in names if conn.execute(
                    "SELECT 1 FROM runs WHERE name=? AND status='queued' "
                    "AND suspect_seq IS NOT NULL LIMIT 1", (n,)).fetchone()]
            return Claimed(claimed, waiting)

        if not names or limit <= 0:
            return Claimed()
        # A claim of many runs takes milliseconds: only small ones run on the loop.
        return await self._calls.call(op, inline=limit <= _INLINE_CLAIM)

    async def claim_suspect(
        self,
        worker_id: str,
        at: Sequence[SuspectsAt],
        *,
        now: float,
        lock_ttl: float,
        build: str | None = None,
    ) -> ClaimedRun | None:
        def op() -> ClaimedRun | None:
            with self._db.tx() as conn:
                flow = conn.execute("SELECT 1 FROM flow_control LIMIT 1").fetchone() is not None
                for place in at:
                    rows = conn.execute(
                        "SELECT run_id, owner, crashes, limit_conc, limit_rate FROM runs "
                        "WHERE name=? AND status='queued' AND suspect_seq IS NOT NULL "
                        "ORDER BY suspect_seq", (place.name,)).fetchall()
                    # The most crashes first, then the longest-waiting (sorted() is stable).
                    rows.sort(key=lambda row: -len(from_json(row[2]) or ()))
                    for run_id, owner, _, conc, rate in rows:
                        if (not flow or flow_allows(conn, owner, now)) and self._limits.room(
                            conn, place.name, conc, rate, now
                        ):
                            return _take(conn, run_id, worker_id, now, lock_ttl, build)
            return None

        return await self._calls.call(op, inline=True)

    async def claim_run(
        self, run_id: str, worker_id: str, *, now: float, lock_ttl: float,
        build: str | None = None,
    ) -> ClaimedRun | None:
        def op() -> ClaimedRun | None:
            with self._db.tx() as conn:
                row = conn.execute(
                    "SELECT status, name, limit_line, suspect_seq, limit_conc, limit_rate "
                    "FROM runs WHERE run_id=?", (run_id,)).fetchone()
                if row is None or row[0] != RunStatus.QUEUED:
                    return None
                status, name, line, suspect, conc, rate = row
                if (line is not None or suspect is not None) and not self._limits.room(
                    conn, name, conc, rate, now
                ):
                    return None  # its key is at its limit: it waits in its line
                return _take(conn, run_id, worker_id, now, lock_ttl, build)

        return await self._calls.call(op, inline=True)

    async def wake_due(self, *, now: float, limit: int) -> int:
        def op() -> int:
            with self._db.tx() as conn:
                due = conn.execute(
                    "SELECT run_id, name, owner, journal_len FROM runs WHERE status IN "
                    "('sleeping', 'waiting') AND wake_at IS NOT NULL AND wake_at<=? "
                    "ORDER BY wake_at LIMIT ?",
                    (now, limit),
                ).fetchall()
                for run_id, name, owner, length in due:
                    woken = make_event(EventType.RUN_WOKEN, now, reason="timer")
                    append_events(conn, run_id, length, [woken], now)
                    enqueue(conn, run_id, name, owner, now)
                return len(due)

        return await self._calls.call(op)

    async def queue_stats(self, names: Sequence[str]) -> dict[str, QueueStat]:
        """One read over the ``runs_queue_p`` index: the queued runs of these names only,
        whatever flow control would let their owners start now."""

        wanted = list(dict.fromkeys(names))
        stats = {name: QueueStat(0, None) for name in wanted}
        if not wanted:
            return stats
        sql = (
            "SELECT name, COUNT(*), MIN(queued_at) FROM runs WHERE status='queued' "
            f"AND name IN ({', '.join('?' * len(wanted))}) GROUP BY name"
        )

        def op(conn: sqlite3.Connection) -> list[tuple[str, int, float | None]]:
            return conn.execute(sql, wanted).fetchall()

        for name, depth, oldest in await self._calls.call(lambda: self._db.read(op)):
            stats[name] = QueueStat(int(depth), None if oldest is None else float(oldest))
        return stats


def _pick(
    conn: sqlite3.Connection, queue: _NameQueue, now: float, blocked: set[str], flow: bool,
) -> str | None:
    """The next run of ``queue`` by deficit round robin over its owners (as the memory
    store's MemoryQueue._pick), honouring flow control (``flow``: some owner has a
    limit)."""
    candidates = queue.candidates(blocked)
    while candidates:
        owner = pick_owner(candidates)
        if owner is None:
            break
        if not flow or flow_allows(conn, owner, now):
            return queue.take(owner)
        blocked.add(owner)
        del candidates[owner]
    return None


def _take(
    conn: sqlite3.Connection, run_id: str, worker_id: str, now: float, lock_ttl: float,
    build: str | None,
) -> ClaimedRun:
    """Start the next attempt of this queued run: one UPDATE and its ``run:started``."""
    row = conn.execute(
        "UPDATE runs SET status='running', attempt=attempt+1, lock_owner=?, lock_expires=?, "
        "started_at=COALESCE(started_at, ?), queue_seq=NULL, limit_line=NULL, limit_seq=NULL, "
        "journal_len=journal_len+1, updated_at=? WHERE run_id=? RETURNING name, params, owner, "
        "attempt, journal_len, parked_seq, start_id, created_at, crashes, suspect_seq, "
        "limit_conc, limit_rate, idempotency_key",
        (worker_id, now + lock_ttl, now, now, run_id),
    ).fetchone()
    if row is None:
        raise WorkflowNotFound(f"no run with id {run_id!r}")
    (name, params, owner, attempt, length, base, start_id, created_at, crashes, suspect,
     conc, rate, idem) = row
    insert_events(conn, run_id, length - 1,
                  [started_event(now, attempt, worker_id, build, idem)])
    values: Any = None
    journal: list[Event] = []
    corrupt: JournalCorrupt | None = None
    try:
        # Not a reason to fail the claim (and roll back the others it took): the
        # worker fails this run, whose attempt and lock are taken like theirs.
        values = record_params(run_id, params)
        journal = read_journal(conn, run_id, base)
    except JournalCorrupt as exc:
        corrupt = exc
    return ClaimedRun(
        run_id=run_id,
        name=name,
        params=values,
        owner=owner or None,
        token=attempt,
        journal=journal,
        base_seq=base,
        start_id=start_id,
        created_at=created_at,
        crashes=tuple(from_json(crashes) or ()),
        journal_error=corrupt,
        suspect=suspect is not None,
        limit_keys=None if conc is None and rate is None else LimitKeys(conc, rate),
    )


class _NameQueue:
    """The queued runs of one workflow name, as one claim transaction sees them.

    The owners with queued runs are found by a skip scan of the ``runs_queue_p`` index
    (one index seek per owner, not a pass over every queued run), each owner's next runs
    are read in queue order (highest priority first, FIFO within one) a batch at a time,
    and the served counts are kept here and written once at the end of the claim
    (``record_served``).
    """

    _OWNERS = (
        "WITH RECURSIVE o(owner) AS ("
        "SELECT (SELECT MIN(owner) FROM runs WHERE name=:name AND status='queued') "
        "UNION ALL SELECT (SELECT MIN(owner) FROM runs WHERE name=:name AND status='queued' "
        "AND owner>o.owner) FROM o WHERE o.owner IS NOT NULL) "
        "SELECT o.owner, COALESCE(s.served, 0) FROM o "
        "LEFT JOIN served s ON s.name=:name AND s.owner=o.owner WHERE o.owner IS NOT NULL"
    )
    # After the cursor (priority, queue_seq) of the last run read, in queue order.
    _NEXT = (
        "SELECT run_id, created_at, queue_seq, priority FROM runs WHERE name=:name "
        "AND owner=:owner AND status='queued' AND queue_seq IS NOT NULL AND (priority<:p "
        "OR (priority=:p AND queue_seq>:seq)) ORDER BY priority DESC, queue_seq LIMIT :count"
    )

    def __init__(self, conn: sqlite3.Connection, name: str, limit: int) -> None:
        self._conn = conn
        self.name = name
        self._limit = limit
        self._served: dict[str, float] = {}
        self._taken: dict[str, int] = {}
        # owner -> its next queued runs (run_id, created_at, queue_seq), oldest first.
        self._next: dict[str, deque[tuple[str, float, int]]] = {}
        # owner -> (priority, queue_seq) of the last run read: the next are after it.
        self._after: dict[str, tuple[int, int]] = {}
        for owner, served in conn.execute(self._OWNERS, {"name": name}).fetchall():
            self._served[owner] = float(served)
            self._after[owner] = (MAX_PRIORITY + 1, -1)
            self._fill(owner, 1)

    def _fill(self, owner: str, count: int) -> None:
        p, seq = self._after[owner]
        rows = self._conn.execute(self._NEXT, {
            "name": self.name, "owner": owner, "p": p, "seq": seq, "count": count,
        }).fetchall()
        if rows:
            self._next[owner] = deque((str(r), float(c), int(q)) for r, c, q, _ in rows)
            self._after[owner] = (int(rows[-1][3]), int(rows[-1][2]))
        else:
            self._next.pop(owner, None)

    def candidates(self, blocked: set[str]) -> dict[str, tuple[float, float]]:
        """owner -> (served, created_at of its next queued run), for ``pick_owner``."""
        return {
            owner: (self._served[owner], runs[0][1])
            for owner, runs in self._next.items() if owner not in blocked
        }

    def take(self, owner: str) -> str:
        """Take ``owner``'s next queued run and charge the owner one run served."""
        runs = self._next[owner]
        run_id = runs.popleft()[0]
        self._served[owner] += 1.0
        self._taken[owner] = self._taken.get(owner, 0) + 1
        if not runs:
            self._fill(owner, max(1, self._limit - sum(self._taken.values())))
        return run_id

    def record_served(self) -> None:
        if self._taken:
            self._conn.executemany(
                "INSERT INTO served(name, owner, served) VALUES (?, ?, ?) "
                "ON CONFLICT(name, owner) DO UPDATE SET served=served+excluded.served",
                [(self.name, owner, float(n)) for owner, n in self._taken.items()],
            )
