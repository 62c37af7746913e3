"""What every part of SQLiteStore shares: options, the connection (one per process,
used from one private thread), transactions, row helpers and the lifecycle."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Self, TypeVar
from urllib.parse import unquote, urlsplit

import orjson

from pyrula.workflows.errors import (
    ConfigurationError,
    StaleToken,
    StoreUnavailable,
    WorkflowNotFound,
)
from pyrula.workflows.events import Event
from pyrula.workflows.records import (
    RunInfo,
    RunStatus,
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


class SQLiteBase:
    """The connection side of SQLiteStore."""

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
    def from_url(cls, url: str, **options: Any) -> Self:
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
        length = self._insert_events(conn, run_id, length, events)
        conn.execute(
            "UPDATE runs SET journal_len=?, updated_at=? WHERE run_id=?", (length, now, run_id)
        )
        return length

    @staticmethod
    def _insert_events(
        conn: sqlite3.Connection, run_id: str, length: int, events: Sequence[Event]
    ) -> int:
        """Insert ``events`` after seq ``length`` (the caller moves ``journal_len``)."""
        rows = []
        for event in events:
            length += 1
            stored = dict(event)
            stored["seq"] = length
            rows.append((run_id, length, _j(stored)))
        if len(rows) == 1:
            conn.execute("INSERT INTO events(run_id, seq, data) VALUES (?, ?, ?)", rows[0])
        elif rows:
            conn.executemany("INSERT INTO events(run_id, seq, data) VALUES (?, ?, ?)", rows)
        return length

    def _fenced_update(
        self, conn: sqlite3.Connection, run_id: str, token: int, assignments: str,
        args: Sequence[Any], returning: str,
    ) -> sqlite3.Row:
        """``UPDATE runs SET assignments`` if this attempt holds the run (the fence and the
        write in one statement); returns the ``returning`` columns, or raises StaleToken
        (or WorkflowNotFound) and changes nothing."""
        row: sqlite3.Row | None = conn.execute(
            f"UPDATE runs SET {assignments} WHERE run_id=? AND status='running' AND attempt=? "
            f"RETURNING {returning}",
            (*args, run_id, token),
        ).fetchone()
        if row is None:
            self._fenced(conn, run_id, token)  # raises: the run is unknown or not ours
            raise AssertionError("unreachable: the fenced update matched no row")
        return row

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

