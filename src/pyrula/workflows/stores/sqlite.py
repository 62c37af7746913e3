"""SQLiteStore: one file on one host, shared safely by several processes.

WAL mode; every state change is one ``BEGIN IMMEDIATE`` transaction, so claims are atomic
across processes (SQLite's write lock serialises them) and no run is claimed twice.
Each store object holds one connection, used from one private thread, so async callers
never block their event loop on the file lock. The semantics are those of MemoryStore,
checked by the same conformance suite.
"""

from __future__ import annotations

import asyncio
import math
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit

import orjson

from pyrula.workflows.errors import (
    ConfigurationError,
    RunNotActive,
    StaleToken,
    StoreUnavailable,
    WorkflowNotFound,
)
from pyrula.workflows.events import INTERRUPT_SIGNAL, Event, EventType, make_event
from pyrula.workflows.records import (
    AppendResult,
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
)
from pyrula.workflows.schedules.schedule import Schedule
from pyrula.workflows.stores.common import (
    NO_OWNER,
    TokenBucket,
    error_event,
    live_crashes,
    new_run_id,
    pick_owner,
    quarantine_error,
    records_run,
    requeued_event,
    schedule_from_store,
    schedule_to_store,
    started_event,
    submitted_event,
    validate_flow_control,
)
from pyrula.workflows.stores.sqlite_schema import ADDITIVE_FROM, SCHEMA, SCHEMA_VERSION
from pyrula.workflows.stores.waiters import ResultWaiters

T = TypeVar("T")

_RUN_COLUMNS = (
    "run_id, name, owner, params, status, attempt, created_at, updated_at, started_at, "
    "finished_at, result, error, wake_at, waiting_for, interrupt, idempotency_key, start_id, "
    "successor_id, cancel_requested, crashes, lock_owner, lock_expires, journal_len, signal_seq, "
    "parked_seq"
)


def _j(value: Any) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS)


def _uj(data: bytes | str | None) -> Any:
    return None if data is None else orjson.loads(data)


class SQLiteStore:
    """A store in one SQLite file (WAL). ``SQLiteStore(path)``; ``:memory:`` is refused
    because it cannot be shared — use MemoryStore for that."""

    #: How long a waiter trusts that no other process finished the run (seconds).
    RESULT_POLL_MAX = 0.25

    def __init__(
        self,
        path: str | os.PathLike[str] = "pyrula.db",
        *,
        busy_timeout: float = 30.0,
        synchronous: str = "NORMAL",
    ) -> None:
        path = os.fspath(path)
        if not path or path == ":memory:":
            raise ConfigurationError(
                "SQLiteStore needs a file path (use MemoryStore for an in-memory store)"
            )
        if synchronous.upper() not in ("OFF", "NORMAL", "FULL", "EXTRA"):
            raise ConfigurationError(
                f"synchronous must be OFF, NORMAL, FULL or EXTRA, got {synchronous!r}"
            )
        self.path = str(Path(path).expanduser())
        self._busy_ms = int(busy_timeout * 1000)
        self._synchronous = synchronous.upper()
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None
        self._pid = os.getpid()
        self._executor: ThreadPoolExecutor | None = None
        self._waiters = ResultWaiters()
        self._connection()  # fail fast on an unusable path

    @classmethod
    def from_url(cls, url: str, **options: Any) -> SQLiteStore:
        """``sqlite:///relative.db``, ``sqlite:////absolute/path.db``."""
        parts = urlsplit(url)
        path = unquote(parts.netloc + parts.path)
        if path.startswith("/") and not parts.netloc:
            path = path[1:]  # sqlite:///rel.db -> rel.db; sqlite:////abs.db -> /abs.db
        if not path:
            raise ConfigurationError(f"store URL {url!r} names no SQLite file")
        return cls(path, **options)

    # --- connection and transactions ------------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        if self._conn is not None and self._pid == os.getpid():
            return self._conn
        # A forked child must never reuse its parent's connection or thread.
        self._pid = os.getpid()
        self._executor = None
        directory = os.path.dirname(os.path.abspath(self.path))
        if not os.path.isdir(directory):
            raise ConfigurationError(f"SQLite store directory does not exist: {directory}")
        try:
            conn = sqlite3.connect(
                self.path, timeout=self._busy_ms / 1000, isolation_level=None,
                check_same_thread=False,
            )
            conn.execute(f"PRAGMA busy_timeout={self._busy_ms}")
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={self._synchronous}")
            conn.execute("PRAGMA foreign_keys=OFF")
            conn.row_factory = sqlite3.Row
            self._migrate(conn)
        except sqlite3.DatabaseError as exc:
            raise StoreUnavailable(f"cannot open SQLite store {self.path}: {exc}") from exc
        self._conn = conn
        return conn

    def _migrate(self, conn: sqlite3.Connection) -> None:
        conn.execute("BEGIN IMMEDIATE")
        try:
            for statement in SCHEMA:
                conn.execute(statement)
            row = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
            if row is None:
                conn.execute(
                    "INSERT INTO meta(key, value) VALUES ('schema_version', ?)", (SCHEMA_VERSION,)
                )
            elif int(row[0]) in ADDITIVE_FROM:
                conn.execute(
                    "UPDATE meta SET value=? WHERE key='schema_version'", (SCHEMA_VERSION,)
                )
            elif int(row[0]) != SCHEMA_VERSION:
                raise ConfigurationError(
                    f"SQLite store {self.path} has schema version {row[0]}, this pyrula "
                    f"needs {SCHEMA_VERSION}"
                )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            conn = self._connection()
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                raise StoreUnavailable(f"SQLite store {self.path} is locked: {exc}") from exc
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            try:
                conn.execute("COMMIT")
            except sqlite3.OperationalError as exc:
                conn.execute("ROLLBACK")
                raise StoreUnavailable(f"SQLite commit failed: {exc}") from exc

    def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        with self._lock:
            try:
                return fn(self._connection())
            except sqlite3.OperationalError as exc:
                raise StoreUnavailable(f"SQLite store {self.path}: {exc}") from exc

    async def _call(self, fn: Callable[[], T]) -> T:
        with self._lock:
            self._connection()
            if self._executor is None:
                self._executor = ThreadPoolExecutor(1, thread_name_prefix="pyrula-sqlite")
            # Submitted under the lock: close() detaches the executor under it, so no call
            # lands on an executor that is shutting down (the store reopens on next use).
            future = asyncio.get_running_loop().run_in_executor(self._executor, fn)
        return await future

    # --- row helpers ----------------------------------------------------------------

    def _row(self, conn: sqlite3.Connection, run_id: str) -> sqlite3.Row | None:
        row: sqlite3.Row | None = conn.execute(
            f"SELECT {_RUN_COLUMNS} FROM runs WHERE run_id=?", (run_id,)
        ).fetchone()
        return row

    def _require(self, conn: sqlite3.Connection, run_id: str) -> sqlite3.Row:
        row = self._row(conn, run_id)
        if row is None:
            raise WorkflowNotFound(f"no run with id {run_id!r}")
        return row

    def _fenced(self, conn: sqlite3.Connection, run_id: str, token: int) -> sqlite3.Row:
        row = self._require(conn, run_id)
        if row["status"] != RunStatus.RUNNING or row["attempt"] != token:
            raise StaleToken(run_id, token, row["attempt"])
        return row

    @staticmethod
    def _info(row: sqlite3.Row) -> RunInfo:
        return RunInfo(
            run_id=row["run_id"],
            name=row["name"],
            status=RunStatus(row["status"]),
            attempt=row["attempt"],
            params=_uj(row["params"]),
            owner=row["owner"] or None,
            created_at=row["created_at"],
            updated_at=row["updated_at"],
            started_at=row["started_at"],
            finished_at=row["finished_at"],
            result=_uj(row["result"]),
            error=_uj(row["error"]),
            wake_at=row["wake_at"],
            waiting_for=tuple(_uj(row["waiting_for"]) or ()),
            interrupt=_uj(row["interrupt"]),
            idempotency_key=row["idempotency_key"],
            start_id=row["start_id"],
            successor_id=row["successor_id"],
        )

    def _append(
        self, conn: sqlite3.Connection, run_id: str, length: int, events: Sequence[Event],
        now: float,
    ) -> int:
        rows = []
        for event in events:
            length += 1
            stored = dict(event)
            stored["seq"] = length
            rows.append((run_id, length, _j(stored)))
        if rows:
            conn.executemany("INSERT INTO events(run_id, seq, data) VALUES (?, ?, ?)", rows)
        conn.execute(
            "UPDATE runs SET journal_len=?, updated_at=? WHERE run_id=?", (length, now, run_id)
        )
        return length

    def _journal(self, conn: sqlite3.Connection, run_id: str, after: int = 0) -> list[Event]:
        rows = conn.execute(
            "SELECT data FROM events WHERE run_id=? AND seq>? ORDER BY seq", (run_id, after)
        ).fetchall()
        return [orjson.loads(r[0]) for r in rows]

    def _next_queue_seq(self, conn: sqlite3.Connection) -> int:
        row = conn.execute(
            "UPDATE meta SET value=CAST(value AS INTEGER)+1 WHERE key='queue_seq' RETURNING value"
        ).fetchone()
        if row is None:
            conn.execute("INSERT INTO meta(key, value) VALUES ('queue_seq', '1')")
            return 1
        return int(row[0])

    def _enqueue(self, conn: sqlite3.Connection, run_id: str, name: str, owner: str) -> None:
        # The run itself is left out: a new one is inserted as 'queued' before this call.
        active = conn.execute(
            "SELECT 1 FROM runs WHERE name=? AND owner=? AND status='queued' AND run_id!=? "
            "LIMIT 1",
            (name, owner, run_id),
        ).fetchone()
        if active is None:
            # A tenant that (re)appears starts level with the least-served active one,
            # not behind its own past (as MemoryStore._enqueue).
            floor = conn.execute(
                "SELECT MIN(s.served) FROM served s WHERE s.name=? AND s.owner!=? AND EXISTS "
                "(SELECT 1 FROM runs r WHERE r.name=s.name AND r.owner=s.owner "
                "AND r.status='queued')",
                (name, owner),
            ).fetchone()[0]
            conn.execute(
                "INSERT INTO served(name, owner, served) VALUES (?, ?, ?) ON CONFLICT(name, owner)"
                " DO UPDATE SET served=excluded.served",
                (name, owner, floor or 0.0),
            )
        conn.execute(
            "UPDATE runs SET status='queued', queue_seq=?, lock_owner=NULL, wake_at=NULL, "
            "waiting_for=NULL, interrupt=NULL WHERE run_id=?",
            (self._next_queue_seq(conn), run_id),
        )

    def _end(
        self, conn: sqlite3.Connection, run_id: str, status: RunStatus, now: float,
        result: Any = None, error: dict[str, Any] | None = None,
    ) -> None:
        conn.execute(
            "UPDATE runs SET status=?, result=?, error=?, lock_owner=NULL, wake_at=NULL, "
            "waiting_for=NULL, finished_at=?, updated_at=?, queue_seq=NULL WHERE run_id=?",
            (status.value, _j(result), None if error is None else _j(error), now, now, run_id),
        )

    def _notify_after(self, run_id: str) -> None:
        self._waiters.notify(run_id)

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

        return await self._call(op)

    # --- attempt writes -------------------------------------------------------------

    async def append(
        self, run_id: str, token: int, events: Sequence[Event], *, now: float, lock_ttl: float
    ) -> AppendResult:
        def op() -> AppendResult:
            with self._tx() as conn:
                row = self._fenced(conn, run_id, token)
                last = self._append(conn, run_id, row["journal_len"], events, now)
                conn.execute(
                    "UPDATE runs SET lock_expires=? WHERE run_id=?", (now + lock_ttl, run_id)
                )
                return AppendResult(last, bool(row["cancel_requested"]))

        return await self._call(op)

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

        return await self._call(op)

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

        finished = await self._call(op)
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

        outcome = await self._call(op)
        self._notify_after(run_id)
        return outcome

    def _requeue(
        self, conn: sqlite3.Connection, row: sqlite3.Row, length: int, now: float, reason: str,
        crash: bool, poison: PoisonPolicy | None, crash_detail: Mapping[str, Any] | None,
    ) -> RequeueOutcome:
        run_id = row["run_id"]
        if crash:
            policy = poison or PoisonPolicy()
            crashes = live_crashes(_uj(row["crashes"]) or [], now, policy.retry_ttl_s) + [now]
            conn.execute("UPDATE runs SET crashes=? WHERE run_id=?", (_j(crashes), run_id))
            if len(crashes) > policy.max_retries:
                error = quarantine_error(len(crashes), crash_detail)
                self._append(conn, run_id, length, [error_event(now, error)], now)
                self._end(conn, run_id, RunStatus.FAILED, now, error=error)
                return RequeueOutcome(run_id, True)
        if row["cancel_requested"]:
            self._append(conn, run_id, length, [make_event(EventType.RUN_CANCELLED, now)], now)
            self._end(conn, run_id, RunStatus.CANCELLED, now)
            return RequeueOutcome(run_id, False)
        self._append(conn, run_id, length, [requeued_event(now, reason)], now)
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
                blocked: set[str] = set()
                progress = True
                while len(claimed) < limit and progress:
                    progress = False
                    for name in names:
                        if len(claimed) >= limit:
                            break
                        run_id = self._pick(conn, name, now, blocked)
                        if run_id is None:
                            continue
                        progress = True
                        claimed.append(self._take(conn, run_id, worker_id, now, lock_ttl))
            return claimed

        if not names or limit <= 0:
            return []
        return await self._call(op)

    async def claim_run(
        self, run_id: str, worker_id: str, *, now: float, lock_ttl: float
    ) -> ClaimedRun | None:
        def op() -> ClaimedRun | None:
            with self._tx() as conn:
                row = self._row(conn, run_id)
                if row is None or row["status"] != RunStatus.QUEUED:
                    return None
                return self._take(conn, run_id, worker_id, now, lock_ttl)

        return await self._call(op)

    def _pick(
        self, conn: sqlite3.Connection, name: str, now: float, blocked: set[str]
    ) -> str | None:
        rows = conn.execute(
            "SELECT r.owner, r.run_id, r.created_at, COALESCE(s.served, 0) FROM runs r "
            "LEFT JOIN served s ON s.name=r.name AND s.owner=r.owner "
            "WHERE r.name=? AND r.status='queued' AND r.queue_seq=(SELECT MIN(q.queue_seq) "
            "FROM runs q WHERE q.name=r.name AND q.owner=r.owner AND q.status='queued')",
            (name,),
        ).fetchall()
        heads = {owner: run_id for owner, run_id, _, _ in rows if owner not in blocked}
        candidates = {
            owner: (float(served), float(created)) for owner, _, created, served in rows
            if owner in heads
        }
        while candidates:
            owner = pick_owner(candidates)
            if owner is None:
                break
            if self._flow_allows(conn, owner, now):
                conn.execute(
                    "INSERT INTO served(name, owner, served) VALUES (?, ?, 1) "
                    "ON CONFLICT(name, owner) DO UPDATE SET served=served+1",
                    (name, owner),
                )
                return str(heads[owner])
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
        row = self._require(conn, run_id)
        attempt = row["attempt"] + 1
        conn.execute(
            "UPDATE runs SET status='running', attempt=?, lock_owner=?, lock_expires=?, "
            "started_at=COALESCE(started_at, ?), queue_seq=NULL WHERE run_id=?",
            (attempt, worker_id, now + lock_ttl, now, run_id),
        )
        self._append(
            conn, run_id, row["journal_len"], [started_event(now, attempt, worker_id)], now
        )
        base = int(row["parked_seq"])
        return ClaimedRun(
            run_id=run_id,
            name=row["name"],
            params=_uj(row["params"]),
            owner=row["owner"] or None,
            token=attempt,
            journal=self._journal(conn, run_id, base),
            base_seq=base,
            start_id=row["start_id"],
            created_at=row["created_at"],
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
        return await self._call(op)

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
    ) -> list[RequeueOutcome]:
        def op() -> list[RequeueOutcome]:
            with self._tx() as conn:
                rows = conn.execute(
                    f"SELECT {_RUN_COLUMNS} FROM runs WHERE status='running' AND lock_owner=?",
                    (worker_id,),
                ).fetchall()
                out = []
                for row in rows:
                    detail = {"cause": "worker_crash", "worker": worker_id,
                              "attempt": row["attempt"], **dict(crash_detail or {})}
                    out.append(self._requeue(conn, row, row["journal_len"], now, "orphaned",
                                             True, poison, detail))
                return out

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

        await self._call(op)

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

        done = await self._call(op)
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

        return await self._call(op)

    # --- reads ----------------------------------------------------------------------

    async def get_run(self, run_id: str) -> RunInfo | None:
        return await self._call(lambda: self._get_sync(run_id))

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
            info = await self.get_run(rid)
            if info is None:
                raise WorkflowNotFound(f"no run with id {rid!r}")
            return info if info.status.terminal else None

        # Other processes finish runs too; re-check at most every RESULT_POLL_MAX.
        return await self._waiters.wait(run_id, check, timeout, poll=self.RESULT_POLL_MAX)

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

    # --- lifecycle ------------------------------------------------------------------

    async def bind(
        self, project: str | None, environment: str | None
    ) -> tuple[str | None, str | None]:
        def op() -> tuple[str | None, str | None]:
            with self._tx() as conn:
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

        return await self._call(op)

    def ping(self) -> None:
        self._read(lambda conn: conn.execute("SELECT 1").fetchone())

    async def aping(self) -> None:
        await self._call(self.ping)

    def close(self) -> None:
        """Finish the calls in flight and close the connection. The store stays usable:
        a later call reopens it (a stopping worker closes it while others may use it)."""
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None and self._pid == os.getpid():
            executor.shutdown(wait=True)  # outside the lock: the calls in flight take it
        with self._lock:
            if self._conn is not None and self._pid == os.getpid():
                self._conn.close()
            self._conn = None

    async def aclose(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.close)

    def __repr__(self) -> str:
        return f"SQLiteStore({self.path!r})"
