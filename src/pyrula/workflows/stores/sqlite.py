"""SQLiteStore: one file on one host, shared safely by several processes.

WAL mode; every state change is atomic under SQLite's write lock (``BEGIN IMMEDIATE``),
so claims are atomic across processes and no run is claimed twice. Each store object
holds one connection, used from one private thread (``sqlite_thread``), so async callers
never wait for the file lock on their event loop. The async calls queued on that thread
together run in one transaction, each in its own savepoint (a group commit): each call
is still all or nothing and fenced inside the transaction, and none returns before the
transaction has committed. Short calls (a run's state change, a small claim, a read of
one run) made in one turn of an event loop run the same way on the loop itself, right
after that turn, when the write lock is free at once (``SQLiteBase._call``): no thread
hop; a lock held elsewhere sends them to the thread. The semantics are those of
MemoryStore, checked by the same conformance suite.
"""

from __future__ import annotations

import sqlite3
import time
from collections import deque
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from pyrula.workflows.errors import (
    JournalCorrupt,
    RunNotActive,
    WorkflowNotFound,
)
from pyrula.workflows.events import INTERRUPT_SIGNAL, Event, EventType, make_event
from pyrula.workflows.records import (
    AppendResult,
    ClaimedRun,
    FinishResult,
    ParkResult,
    PoisonPolicy,
    RenewResult,
    RequeueOutcome,
    RunHandle,
    RunInfo,
    RunStatus,
)
from pyrula.workflows.stores.common import (
    NO_OWNER,
    TokenBucket,
    error_event,
    live_crashes,
    new_run_id,
    pick_owner,
    quarantine_error,
    record_params,
    requeued_event,
    started_event,
    submitted_event,
)
from pyrula.workflows.stores.sqlite_admin import SQLiteAdmin
from pyrula.workflows.stores.sqlite_base import _RUN_COLUMNS, _j, _uj

#: Claims of at most this many runs may run on the caller's event loop (see _call).
_INLINE_CLAIM = 64


class SQLiteStore(SQLiteAdmin):
    """A store in one SQLite file (WAL). ``SQLiteStore(path)``; ``:memory:`` is refused
    because it cannot be shared — use MemoryStore for that."""

    # --- submit ---------------------------------------------------------------------

    def _new_run(
        self, conn: sqlite3.Connection, name: str, params: Any, owner: str, now: float,
        idempotency_key: str | None, start_id: str | None, predecessor: str | None = None,
    ) -> str:
        run_id = new_run_id(now)
        conn.execute(
            "INSERT INTO runs(run_id, name, owner, params, status, attempt, created_at, "
            "updated_at, idempotency_key, start_id, journal_len, crashes, signal_seq) "
            "VALUES (?, ?, ?, ?, 'queued', 0, ?, ?, ?, ?, 0, '[]', '{}')",
            (run_id, name, owner, _j(params), now, now, idempotency_key, start_id or run_id),
        )
        event = submitted_event(now, name, params, owner or None, idempotency_key)
        if predecessor is not None:
            event["predecessor"] = predecessor
        self._append(conn, run_id, 0, [event], now)
        self._enqueue(conn, run_id, name, owner)
        return run_id

    async def submit(
        self,
        name: str,
        params: Any,
        *,
        now: float,
        owner: str | None = None,
        idempotency_key: str | None = None,
    ) -> tuple[RunHandle, bool]:
        def op() -> tuple[RunHandle, bool]:
            with self._tx() as conn:
                if idempotency_key is not None:
                    row = conn.execute(
                        "SELECT run_id FROM runs WHERE name=? AND idempotency_key=?",
                        (name, idempotency_key),
                    ).fetchone()
                    if row is not None:
                        return RunHandle(name, row[0]), False
                run_id = self._new_run(
                    conn, name, params, owner or NO_OWNER, now, idempotency_key, None
                )
                return RunHandle(name, run_id), True

        return await self._call(op, inline=True)

    # --- attempt writes -------------------------------------------------------------

    async def append(
        self, run_id: str, token: int, events: Sequence[Event], *, now: float, lock_ttl: float
    ) -> AppendResult:
        def op() -> AppendResult:
            with self._tx() as conn:
                last, cancel_requested = self._fenced_update(
                    conn, run_id, token,
                    "journal_len=journal_len+?, updated_at=?, lock_expires=?",
                    (len(events), now, now + lock_ttl), "journal_len, cancel_requested",
                )
                self._insert_events(conn, run_id, last - len(events), events)
                return AppendResult(last, bool(cancel_requested))

        return await self._call(op, inline=True)

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
        def op() -> ParkResult:
            with self._tx() as conn:
                row = self._fenced(conn, run_id, token)
                last = self._append(conn, run_id, row["journal_len"], events, now)
                seen = _uj(row["signal_seq"]) or {}
                arrived = any(int(seen.get(s, 0)) > known_seq for s in signals)
                if arrived or row["cancel_requested"]:
                    tail = self._journal(conn, run_id, known_seq)
                    return ParkResult(False, last, tail, bool(row["cancel_requested"]))
                conn.execute(
                    "UPDATE runs SET status=?, lock_owner=NULL, waiting_for=?, interrupt=?, "
                    "wake_at=?, parked_seq=? WHERE run_id=?",
                    (
                        (RunStatus.WAITING if signals else RunStatus.SLEEPING).value,
                        _j(list(signals)) if signals else None,
                        _j(interrupt) if INTERRUPT_SIGNAL in signals else None,
                        wake_at,
                        last,
                        run_id,
                    ),
                )
                return ParkResult(True, last)

        return await self._call(op, inline=True)

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
        def op() -> FinishResult:
            with self._tx() as conn:
                if status is not RunStatus.CONTINUED:
                    # The fence, the end and the journal length in one statement.
                    (last,) = self._fenced_update(
                        conn, run_id, token,
                        "status=?, result=?, error=?, lock_owner=NULL, wake_at=NULL, "
                        "waiting_for=NULL, finished_at=?, updated_at=?, queue_seq=NULL, "
                        "journal_len=journal_len+?",
                        (status.value, _j(result), None if error is None else _j(error), now,
                         now, len(events)),
                        "journal_len",
                    )
                    self._insert_events(conn, run_id, last - len(events), events)
                    return FinishResult(last, None)
                row = self._fenced(conn, run_id, token)
                batch = [dict(e) for e in events]
                successor_id = None
                if status is RunStatus.CONTINUED:
                    successor_id = self._new_run(
                        conn, row["name"], successor_params, row["owner"], now, None,
                        row["start_id"], predecessor=run_id,
                    )
                    conn.execute(
                        "UPDATE runs SET successor_id=? WHERE run_id=?", (successor_id, run_id)
                    )
                    batch[-1]["successor"] = successor_id
                last = self._append(conn, run_id, row["journal_len"], batch, now)
                self._end(conn, run_id, status, now, result, error)
                return FinishResult(last, successor_id)

        finished = await self._call(op, inline=True)
        self._notify_after(run_id)
        return finished

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
        def op() -> RequeueOutcome:
            with self._tx() as conn:
                row = self._fenced(conn, run_id, token)
                length = self._append(conn, run_id, row["journal_len"], events, now)
                return self._requeue(conn, row, length, now, reason, crash, poison, crash_detail)

        outcome = await self._call(op, inline=True)
        self._notify_after(run_id)
        return outcome

    def _requeue(
        self, conn: sqlite3.Connection, row: sqlite3.Row, length: int, now: float, reason: str,
        crash: bool, poison: PoisonPolicy | None, crash_detail: Mapping[str, Any] | None,
    ) -> RequeueOutcome:
        run_id = row["run_id"]
        counted = None
        if crash:
            policy = poison or PoisonPolicy()
            crashes = live_crashes(_uj(row["crashes"]) or [], now, policy.retry_ttl_s) + [now]
            conn.execute("UPDATE runs SET crashes=? WHERE run_id=?", (_j(crashes), run_id))
            counted = len(crashes)
            if counted > policy.max_retries:
                error = quarantine_error(counted, crash_detail)
                self._append(conn, run_id, length, [error_event(now, error)], now)
                self._end(conn, run_id, RunStatus.FAILED, now, error=error)
                return RequeueOutcome(run_id, True)
        if row["cancel_requested"]:
            self._append(conn, run_id, length, [make_event(EventType.RUN_CANCELLED, now)], now)
            self._end(conn, run_id, RunStatus.CANCELLED, now)
            return RequeueOutcome(run_id, False)
        self._append(conn, run_id, length, [requeued_event(now, reason, counted)], now)
        self._enqueue(conn, run_id, row["name"], row["owner"])
        return RequeueOutcome(run_id, False)

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
        def op() -> list[ClaimedRun]:
            claimed: list[ClaimedRun] = []
            with self._tx() as conn:
                flow = conn.execute("SELECT 1 FROM flow_control LIMIT 1").fetchone() is not None
                queues = [_NameQueue(conn, name, limit) for name in names]
                blocked: set[str] = set()
                progress = True
                while len(claimed) < limit and progress:
                    progress = False
                    for queue in queues:
                        if len(claimed) >= limit:
                            break
                        run_id = self._pick(conn, queue, now, blocked, flow)
                        if run_id is None:
                            continue
                        progress = True
                        claimed.append(self._take(conn, run_id, worker_id, now, lock_ttl))
                for queue in queues:
                    queue.record_served()
            return claimed

        if not names or limit <= 0:
            return []
        # A claim of many runs takes milliseconds: only small ones run on the loop.
        return await self._call(op, inline=limit <= _INLINE_CLAIM)

    async def claim_run(
        self, run_id: str, worker_id: str, *, now: float, lock_ttl: float
    ) -> ClaimedRun | None:
        def op() -> ClaimedRun | None:
            with self._tx() as conn:
                row = conn.execute("SELECT status FROM runs WHERE run_id=?", (run_id,)).fetchone()
                if row is None or row[0] != RunStatus.QUEUED:
                    return None
                return self._take(conn, run_id, worker_id, now, lock_ttl)

        return await self._call(op, inline=True)

    def _pick(
        self, conn: sqlite3.Connection, queue: _NameQueue, now: float, blocked: set[str],
        flow: bool,
    ) -> str | None:
        """The next run of ``queue`` by deficit round robin over its owners (as
        MemoryStore._pick), honouring flow control (``flow``: some owner has a limit)."""
        candidates = queue.candidates(blocked)
        while candidates:
            owner = pick_owner(candidates)
            if owner is None:
                break
            if not flow or self._flow_allows(conn, owner, now):
                return queue.take(owner)
            blocked.add(owner)
            del candidates[owner]
        return None

    def _flow_allows(self, conn: sqlite3.Connection, owner: str, now: float) -> bool:
        row = conn.execute(
            "SELECT max_concurrent, max_starts_per_second, tokens, stamp FROM flow_control "
            "WHERE owner=?",
            (owner,),
        ).fetchone()
        if row is None:
            return True
        max_concurrent, rate, tokens, stamp = row
        if max_concurrent is not None:
            running = conn.execute(
                "SELECT COUNT(*) FROM runs WHERE owner=? AND status='running'", (owner,)
            ).fetchone()[0]
            if running >= max_concurrent:
                return False
        if rate is not None:
            bucket = TokenBucket(1.0 if tokens is None else tokens, now if stamp is None else stamp)
            allowed = bucket.take(rate, now)
            conn.execute(
                "UPDATE flow_control SET tokens=?, stamp=? WHERE owner=?",
                (bucket.tokens, bucket.stamp, owner),
            )
            return allowed
        return True

    def _take(
        self, conn: sqlite3.Connection, run_id: str, worker_id: str, now: float, lock_ttl: float
    ) -> ClaimedRun:
        """Start the next attempt of this queued run: one UPDATE and its ``run:started``."""
        row = conn.execute(
            "UPDATE runs SET status='running', attempt=attempt+1, lock_owner=?, lock_expires=?, "
            "started_at=COALESCE(started_at, ?), queue_seq=NULL, journal_len=journal_len+1, "
            "updated_at=? WHERE run_id=? RETURNING name, params, owner, attempt, journal_len, "
            "parked_seq, start_id, created_at, crashes",
            (worker_id, now + lock_ttl, now, now, run_id),
        ).fetchone()
        if row is None:
            raise WorkflowNotFound(f"no run with id {run_id!r}")
        name, params, owner, attempt, length, base, start_id, created_at, crashes = row
        self._insert_events(conn, run_id, length - 1, [started_event(now, attempt, worker_id)])
        values: Any = None
        journal: list[Event] = []
        corrupt: JournalCorrupt | None = None
        try:
            # Not a reason to fail the claim (and roll back the others it took): the
            # worker fails this run, whose attempt and lock are taken like theirs.
            values = record_params(run_id, params)
            journal = self._journal(conn, run_id, base)
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
            crashes=tuple(_uj(crashes) or ()),
            journal_error=corrupt,
        )

    async def renew(
        self, worker_id: str, held: Mapping[str, int], *, now: float, lock_ttl: float
    ) -> RenewResult:
        def op() -> RenewResult:
            lost: set[str] = set()
            cancel: set[str] = set()
            with self._tx() as conn:
                for run_id, token in held.items():
                    row = conn.execute(
                        "SELECT status, attempt, cancel_requested FROM runs WHERE run_id=?",
                        (run_id,),
                    ).fetchone()
                    if row is None or row[0] != RunStatus.RUNNING or row[1] != token:
                        lost.add(run_id)
                        continue
                    conn.execute(
                        "UPDATE runs SET lock_expires=? WHERE run_id=?", (now + lock_ttl, run_id)
                    )
                    if row[2]:
                        cancel.add(run_id)
            return RenewResult(frozenset(lost), frozenset(cancel))

        if not held:
            return RenewResult()
        return await self._call(op, inline=True)

    async def wake_due(self, *, now: float, limit: int) -> int:
        def op() -> int:
            with self._tx() as conn:
                rows = conn.execute(
                    "SELECT run_id, name, owner, journal_len FROM runs WHERE status IN "
                    "('sleeping', 'waiting') AND wake_at IS NOT NULL AND wake_at<=? "
                    "ORDER BY wake_at LIMIT ?",
                    (now, limit),
                ).fetchall()
                for run_id, name, owner, length in rows:
                    woken = make_event(EventType.RUN_WOKEN, now, reason="timer")
                    self._append(conn, run_id, length, [woken], now)
                    self._enqueue(conn, run_id, name, owner)
                return len(rows)

        return await self._call(op)

    async def reclaim(
        self,
        names: Sequence[str] | None,
        *,
        now: float,
        limit: int,
        poison: PoisonPolicy,
    ) -> list[RequeueOutcome]:
        outcomes = await self._call(lambda: self._reclaim(names, now, limit, poison))
        for outcome in outcomes:
            self._notify_after(outcome.run_id)
        return outcomes

    def _reclaim(
        self, names: Sequence[str] | None, now: float, limit: int, poison: PoisonPolicy
    ) -> list[RequeueOutcome]:
        with self._tx() as conn:
            sql = f"SELECT {_RUN_COLUMNS} FROM runs WHERE status='running' AND lock_expires<=?"
            args: list[Any] = [now]
            if names is not None:
                if not names:
                    return []
                sql += f" AND name IN ({','.join('?' * len(names))})"
                args.extend(names)
            sql += " ORDER BY lock_expires LIMIT ?"
            args.append(limit)
            out = []
            for row in conn.execute(sql, args).fetchall():
                detail = {
                    "cause": "worker_crash", "worker": row["lock_owner"], "attempt": row["attempt"]
                }
                out.append(
                    self._requeue(conn, row, row["journal_len"], now, "orphaned", True, poison,
                                  detail)
                )
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

        def op() -> list[RequeueOutcome]:
            with self._tx() as conn:
                rows = conn.execute(
                    f"SELECT {_RUN_COLUMNS} FROM runs WHERE status='running' AND lock_owner=?",
                    (worker_id,),
                ).fetchall()
                out = []
                for row in rows:
                    crash = charged is None or row["run_id"] in charged
                    detail = {"cause": "worker_crash", "worker": worker_id,
                              "attempt": row["attempt"], **dict(crash_detail or {})}
                    out.append(self._requeue(conn, row, row["journal_len"], now, "orphaned",
                                             crash, poison, detail))
                return out

        outcomes = await self._call(op)
        for outcome in outcomes:
            self._notify_after(outcome.run_id)
        return outcomes

    async def requeue_unheld(
        self, worker_id: str, held: Collection[str], *, now: float
    ) -> list[RequeueOutcome]:
        keep = set(held)

        def op() -> list[RequeueOutcome]:
            with self._tx() as conn:
                rows = conn.execute(
                    f"SELECT {_RUN_COLUMNS} FROM runs WHERE status='running' AND lock_owner=?",
                    (worker_id,),
                ).fetchall()
                return [
                    self._requeue(conn, row, row["journal_len"], now, "store_unavailable",
                                  False, None, None)
                    for row in rows if row["run_id"] not in keep
                ]

        outcomes = await self._call(op)
        for outcome in outcomes:
            self._notify_after(outcome.run_id)
        return outcomes

    def recover_pending_runs(self, name: str) -> int:
        return len(self._reclaim([name], time.time(), 1 << 30, PoisonPolicy()))

    # --- run control ----------------------------------------------------------------

    async def signal(self, run_id: str, name: str, payload: Any, *, now: float) -> None:
        def op() -> None:
            with self._tx() as conn:
                row = self._require(conn, run_id)
                status = RunStatus(row["status"])
                if status.terminal:
                    raise RunNotActive(f"run {run_id} has already ended ({status.value})")
                type_ = (
                    EventType.INTERRUPT_RESUMED if name == INTERRUPT_SIGNAL
                    else EventType.SIGNAL_RECEIVED
                )
                event = make_event(type_, now, name=name, payload=payload)
                last = self._append(conn, run_id, row["journal_len"], [event], now)
                seen = _uj(row["signal_seq"]) or {}
                seen[name] = last
                conn.execute("UPDATE runs SET signal_seq=? WHERE run_id=?", (_j(seen), run_id))
                waiting = _uj(row["waiting_for"]) or []
                if status is RunStatus.WAITING and name in waiting:
                    self._enqueue(conn, run_id, row["name"], row["owner"])

        await self._call(op, inline=True)

    async def cancel(self, run_id: str, *, now: float) -> bool:
        def op() -> bool:
            with self._tx() as conn:
                row = self._require(conn, run_id)
                status = RunStatus(row["status"])
                if status.terminal:
                    return False
                if status is RunStatus.RUNNING:
                    conn.execute(
                        "UPDATE runs SET cancel_requested=1, updated_at=? WHERE run_id=?",
                        (now, run_id),
                    )
                    return True
                cancelled = make_event(EventType.RUN_CANCELLED, now)
                self._append(conn, run_id, row["journal_len"], [cancelled], now)
                self._end(conn, run_id, RunStatus.CANCELLED, now)
                return True

        done = await self._call(op, inline=True)
        self._notify_after(run_id)
        return done

    async def wake_run(self, run_id: str, *, now: float) -> bool:
        def op() -> bool:
            with self._tx() as conn:
                row = self._require(conn, run_id)
                if row["status"] != RunStatus.SLEEPING:
                    return False
                woken = make_event(EventType.RUN_WOKEN, now, reason="manual")
                self._append(conn, run_id, row["journal_len"], [woken], now)
                self._enqueue(conn, run_id, row["name"], row["owner"])
                return True

        return await self._call(op, inline=True)

    # --- reads ----------------------------------------------------------------------

    async def get_run(self, run_id: str) -> RunInfo | None:
        return await self._call(lambda: self._get_sync(run_id), inline=True)

    def _get_sync(self, run_id: str) -> RunInfo | None:
        def op(conn: sqlite3.Connection) -> RunInfo | None:
            row = self._row(conn, run_id)
            return None if row is None else self._info(row)

        return self._read(op)

    async def read_events(self, run_id: str, after_seq: int = 0) -> list[Event]:
        def op(conn: sqlite3.Connection) -> list[Event]:
            self._require(conn, run_id)
            return self._journal(conn, run_id, after_seq)

        return await self._call(lambda: self._read(op))

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
            f"SELECT {_RUN_COLUMNS} FROM runs {where} "
            "ORDER BY created_at DESC, run_id DESC LIMIT ?"
        )
        args.append(limit)

        def op(conn: sqlite3.Connection) -> list[RunInfo]:
            return [self._info(r) for r in conn.execute(sql, args).fetchall()]

        return await self._call(lambda: self._read(op))

    async def wait_result(self, run_id: str, timeout: float | None) -> RunInfo:
        async def check(rid: str) -> RunInfo | None:
            info = self._ends.found(rid)
            if info is None:
                info = await self.get_run(rid)
            if info is None:
                raise WorkflowNotFound(f"no run with id {rid!r}")
            return info if info.status.terminal else None

        # Other processes finish runs too: this loop's EndWatch looks them up together,
        # and each waiter re-checks on its own only every RESULT_CHECK_S.
        with self._ends.watching(run_id):
            return await self._waiters.wait(
                run_id, check, timeout, poll=self.RESULT_CHECK_S, first_poll=self.RESULT_CHECK_S
            )


class _NameQueue:
    """The queued runs of one workflow name, as one claim transaction sees them.

    The owners with queued runs are found by a skip scan of the ``runs_queue`` index (one
    index seek per owner, not a pass over every queued run), each owner's next runs are
    read in queue order a batch at a time, and the served counts are kept here and written
    once at the end of the claim (``record_served``).
    """

    _OWNERS = (
        "WITH RECURSIVE o(owner) AS ("
        "SELECT (SELECT MIN(owner) FROM runs WHERE name=:name AND status='queued') "
        "UNION ALL SELECT (SELECT MIN(owner) FROM runs WHERE name=:name AND status='queued' "
        "AND owner>o.owner) FROM o WHERE o.owner IS NOT NULL) "
        "SELECT o.owner, COALESCE(s.served, 0) FROM o "
        "LEFT JOIN served s ON s.name=:name AND s.owner=o.owner WHERE o.owner IS NOT NULL"
    )
    _NEXT = (
        "SELECT run_id, created_at, queue_seq FROM runs WHERE name=? AND owner=? "
        "AND status='queued' AND queue_seq>? ORDER BY queue_seq LIMIT ?"
    )

    def __init__(self, conn: sqlite3.Connection, name: str, limit: int) -> None:
        self._conn = conn
        self.name = name
        self._limit = limit
        self._served: dict[str, float] = {}
        self._taken: dict[str, int] = {}
        # owner -> its next queued runs (run_id, created_at, queue_seq), oldest first.
        self._next: dict[str, deque[tuple[str, float, int]]] = {}
        self._after: dict[str, int] = {}
        for owner, served in conn.execute(self._OWNERS, {"name": name}).fetchall():
            self._served[owner] = float(served)
            self._after[owner] = -1
            self._fill(owner, 1)

    def _fill(self, owner: str, count: int) -> None:
        rows = self._conn.execute(
            self._NEXT, (self.name, owner, self._after[owner], count)
        ).fetchall()
        if rows:
            self._next[owner] = deque((str(r), float(c), int(q)) for r, c, q in rows)
            self._after[owner] = int(rows[-1][2])
        else:
            self._next.pop(owner, None)

    def candidates(self, blocked: set[str]) -> dict[str, tuple[float, float]]:
        """owner -> (served, created_at of its oldest queued run), for ``pick_owner``."""
        return {
            owner: (self._served[owner], runs[0][1])
            for owner, runs in self._next.items() if owner not in blocked
        }

    def take(self, owner: str) -> str:
        """Take ``owner``'s oldest queued run and charge the owner one run served."""
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
