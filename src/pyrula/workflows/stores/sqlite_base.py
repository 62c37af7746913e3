"""What every part of SQLiteStore shares: options, the connection (one per process,
used from one private thread), transactions, row helpers and the lifecycle."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Self, TypeVar
from urllib.parse import parse_qs, unquote, urlsplit

import orjson

from pyrula.workflows.errors import (
    ConfigurationError,
    StaleToken,
    StoreUnavailable,
    WorkflowNotFound,
)
from pyrula.workflows.events import Event
from pyrula.workflows.records import (
    TERMINAL_STATUSES,
    RunInfo,
    RunStatus,
)
from pyrula.workflows.stores.common import journal_entry
from pyrula.workflows.stores.sqlite_schema import ADDITIVE_FROM, SCHEMA, SCHEMA_VERSION
from pyrula.workflows.stores.sqlite_thread import (
    Batch,
    Call,
    Checkpointer,
    StoreThread,
    WouldBlock,
    resolve,
)
from pyrula.workflows.stores.waiters import EndWatch, ResultWaiters

T = TypeVar("T")

_RUN_COLUMNS = (
    "run_id, name, owner, params, status, attempt, created_at, updated_at, started_at, "
    "finished_at, result, error, wake_at, waiting_for, interrupt, idempotency_key, start_id, "
    "successor_id, cancel_requested, crashes, lock_owner, lock_expires, journal_len, signal_seq, "
    "parked_seq"
)


_TERMINAL = ", ".join(f"'{s.value}'" for s in sorted(TERMINAL_STATUSES))


def _j(value: Any) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS)


def _uj(data: bytes | str | None) -> Any:
    return None if data is None else orjson.loads(data)


#: SQLITE_BUSY, the primary code of every "database is locked" (extended codes add bits).
_SQLITE_BUSY = 5
#: Waiting for another process's write lock: the first retry comes after this long,
#: doubling up to _BUSY_SLEEP_MAX. SQLite's own busy handler sleeps 1 ms, then 2, 5,
#: 10 ... ms, while a transaction here holds the lock for a fraction of a millisecond.
_BUSY_SLEEP_MIN = 0.00005
_BUSY_SLEEP_MAX = 0.001
#: SQLite's default wal_autocheckpoint (pages), what a connection runs with while no
#: Checkpointer of this store works.
_AUTOCHECKPOINT = 1000
#: Calls run on an event loop in one turn: at most this many, for at most this long
#: (the rest run in the next turns), so the loop is never held for long.
_INLINE_MAX_CALLS = 32
_INLINE_BUDGET_S = 0.002


def _is_busy(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return int(code) & 0xFF == _SQLITE_BUSY
    return "locked" in str(exc)


def _primary_code(exc: BaseException) -> int | None:
    code = getattr(exc, "sqlite_errorcode", None)
    return None if code is None else int(code) & 0xFF


#: Failures of the disk under the file, not of the statement: a call that meets one is
#: reported as StoreUnavailable (the worker puts its run back; nothing was written).
_DISK_ERRORS = frozenset({sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_CANTOPEN})


def describe(exc: BaseException) -> str:
    """An SQLite failure in words, the underlying sqlite3 error's once (not the wrappers'),
    saying so plainly when the disk is full."""
    while isinstance(exc, StoreUnavailable) and isinstance(exc.__cause__, sqlite3.Error):
        exc = exc.__cause__
    if _primary_code(exc) == sqlite3.SQLITE_FULL:
        return f"the disk is full ({exc}): nothing was written; free space on it"
    return str(exc)


class SQLiteBase:
    """The connection side of SQLiteStore."""

    #: The longest a result waiter's loop goes without looking whether runs it waits for
    #: ended in another process (seconds); it looks every 5 ms while ends keep coming.
    RESULT_POLL_MAX = 0.25
    #: How often each waiter also re-checks its own run (a safety net under EndWatch).
    RESULT_CHECK_S = 1.0
    #: A checkpoint runs on a thread of its own this long after a commit (see Checkpointer).
    CHECKPOINT_AFTER_S = 0.1

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
        #: Guards the connection; held by a transaction (or a whole batch) and by reads.
        #: Never taken on an event loop.
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None
        #: Closes the connection if the store is collected without ``close()`` (Python
        #: 3.13 warns of a connection collected open, and it holds the file meanwhile).
        self._conn_finalizer: weakref.finalize[Any, Any] | None = None
        self._pid = os.getpid()
        #: Whether calls may run on their event loop (see _call): the file is in WAL mode
        #: (known once the connection is open) and a commit does not wait for a sync.
        self._wal = False
        #: The connection's wal_autocheckpoint (pages), as _commit set it.
        self._autocheckpoint = _AUTOCHECKPOINT
        #: Guards ``_thread`` and ``_checkpointer`` only (held for no I/O).
        self._thread_lock = threading.Lock()
        self._thread: StoreThread | None = None
        self._checkpointer: Checkpointer | None = None
        #: Calls made on each event loop since it last ran them (see _call).
        self._on_loop: dict[asyncio.AbstractEventLoop, list[Call]] = {}
        #: The batch this thread is running (the store thread, or a loop running its calls).
        self._local = threading.local()
        self._waiters = ResultWaiters()
        self._ends = EndWatch(self._waiters, self._ended_among, self.RESULT_POLL_MAX)
        self._connection()  # fail fast on an unusable path

    @classmethod
    def from_url(cls, url: str, **options: Any) -> Self:
        """``sqlite:///relative.db``, ``sqlite:////absolute/path.db``; the query may set
        ``synchronous`` (``?synchronous=FULL``: commits survive a power loss too)."""
        parts = urlsplit(url)
        path = unquote(parts.netloc + parts.path)
        if path.startswith("/") and not parts.netloc:
            path = path[1:]  # sqlite:///rel.db -> rel.db; sqlite:////abs.db -> /abs.db
        if not path:
            raise ConfigurationError(f"store URL {url!r} names no SQLite file")
        for key, values in parse_qs(parts.query, keep_blank_values=True).items():
            if key != "synchronous":
                raise ConfigurationError(
                    f"store URL {url!r}: unknown option {key!r} (a SQLite URL takes "
                    "?synchronous=OFF|NORMAL|FULL|EXTRA)")
            options.setdefault("synchronous", values[-1])
        return cls(path, **options)

    # --- connection and transactions ------------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        if self._conn is not None and self._pid == os.getpid():
            return self._conn
        # A forked child must never reuse its parent's connection (nor its thread: _call
        # starts a new one).
        self._pid = os.getpid()
        directory = os.path.dirname(os.path.abspath(self.path))
        if not os.path.isdir(directory):
            raise ConfigurationError(f"SQLite store directory does not exist: {directory}")
        try:
            conn = sqlite3.connect(
                self.path, timeout=self._busy_ms / 1000, isolation_level=None,
                check_same_thread=False,
            )
        except sqlite3.DatabaseError as exc:
            raise StoreUnavailable(f"cannot open SQLite store {self.path}: {exc}") from exc
        try:
            conn.execute(f"PRAGMA busy_timeout={self._busy_ms}")
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()
            self._wal = mode is not None and str(mode[0]).lower() == "wal"
            conn.execute(f"PRAGMA wal_autocheckpoint={_AUTOCHECKPOINT}")
            self._autocheckpoint = _AUTOCHECKPOINT
            conn.execute(f"PRAGMA synchronous={self._synchronous}")
            conn.execute("PRAGMA foreign_keys=OFF")
            conn.row_factory = sqlite3.Row
            self._migrate(conn)
            # From here on a lock held by another process is waited for by _begin and
            # _read, in finer steps than SQLite's own busy handler takes.
            conn.execute("PRAGMA busy_timeout=0")
        except BaseException as exc:
            conn.close()  # refused (a newer schema, say): the file is not held open
            if isinstance(exc, sqlite3.DatabaseError):
                raise StoreUnavailable(
                    f"cannot open SQLite store {self.path}: {describe(exc)}") from exc
            raise
        self._conn = conn
        self._conn_finalizer = weakref.finalize(self, _close_in, self._pid, conn)
        # Not at exit: a daemon thread may still be using it then, and the process's end
        # closes it anyway.
        self._conn_finalizer.atexit = False
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

    def _retry_busy(self, attempt: Callable[[], T], what: str) -> T:
        """``attempt()``, retried while another connection holds a lock it needs, for up
        to ``busy_timeout`` (then StoreUnavailable)."""
        deadline: float | None = None
        delay = _BUSY_SLEEP_MIN
        while True:
            try:
                return attempt()
            except sqlite3.OperationalError as exc:
                if not _is_busy(exc):
                    raise self._unavailable(exc) from exc
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self._busy_ms / 1000
                if now >= deadline:
                    raise StoreUnavailable(
                        f"SQLite store {self.path} is locked ({what}): {exc}"
                    ) from exc
                time.sleep(min(delay, deadline - now))
                delay = min(delay * 2, _BUSY_SLEEP_MAX)

    def _begin(self, conn: sqlite3.Connection, batch: Batch | None = None) -> None:
        if batch is not None and batch.inline:
            self._once(lambda: conn.execute("BEGIN IMMEDIATE"))
            return
        self._retry_busy(lambda: conn.execute("BEGIN IMMEDIATE"), "waiting for its write lock")

    def _once(self, attempt: Callable[[], T]) -> T:
        """``attempt()`` on an event loop: WouldBlock instead of waiting for a lock."""
        try:
            return attempt()
        except sqlite3.OperationalError as exc:
            if _is_busy(exc):
                raise WouldBlock from exc
            raise self._unavailable(exc) from exc

    def _commit(self, conn: sqlite3.Connection) -> None:
        # Only a file that is not in WAL mode can be busy here; the transaction then stays
        # open and COMMIT may be retried.
        self._retry_busy(lambda: conn.execute("COMMIT"), "committing")
        checkpointer = self._checkpointer
        if checkpointer is None or checkpointer.pid != os.getpid():
            return
        # While the Checkpointer works, no commit here pays for a checkpoint; if it
        # fails, SQLite's automatic checkpoint takes over again.
        pages = _AUTOCHECKPOINT if checkpointer.failed else 0
        if pages != self._autocheckpoint:
            conn.execute(f"PRAGMA wal_autocheckpoint={pages}")
            self._autocheckpoint = pages
        if not pages:
            checkpointer.committed()

    def _batch(self) -> Batch | None:
        batch: Batch | None = getattr(self._local, "batch", None)
        return batch

    def _unavailable(self, exc: BaseException, what: str = "") -> StoreUnavailable:
        return StoreUnavailable(f"SQLite store {self.path}: {what}{describe(exc)}")

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One state change, atomic: its own transaction, or on the store thread its own
        savepoint in the transaction of the batch it is part of (committed before any
        call of the batch returns). A statement the disk fails (full, an I/O error) is
        StoreUnavailable."""
        batch = self._batch()
        with self._lock:
            conn = self._connection()
            try:
                if batch is None:
                    with self._own_tx(conn):
                        yield conn
                else:
                    with self._savepoint(conn, batch):
                        yield conn
            except sqlite3.OperationalError as exc:
                if _primary_code(exc) in _DISK_ERRORS:
                    raise self._unavailable(exc) from exc
                raise

    @contextmanager
    def _own_tx(self, conn: sqlite3.Connection) -> Iterator[None]:
        self._begin(conn)
        try:
            yield
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        try:
            self._commit(conn)
        except (sqlite3.Error, StoreUnavailable) as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise self._unavailable(exc, "commit failed: ") from exc

    @contextmanager
    def _savepoint(self, conn: sqlite3.Connection, batch: Batch) -> Iterator[None]:
        if not batch.open:
            if batch.locked_out is not None:  # the batch waited busy_timeout already
                raise StoreUnavailable(str(batch.locked_out))
            try:
                self._begin(conn, batch)
            except StoreUnavailable as exc:
                batch.locked_out = exc
                raise
            batch.open = True
        conn.execute("SAVEPOINT pyrula_call")
        batch.depth += 1
        try:
            yield
        except BaseException:
            batch.depth -= 1
            self._undo_savepoint(conn, batch)
            raise
        batch.depth -= 1
        conn.execute("RELEASE pyrula_call")
        batch.depends()

    def _undo_savepoint(self, conn: sqlite3.Connection, batch: Batch) -> None:
        """Roll one call back to its savepoint; if SQLite dropped the whole transaction
        (an I/O error, say), every call that depended on it fails too."""
        if conn.in_transaction:
            try:
                conn.execute("ROLLBACK TO pyrula_call")
                conn.execute("RELEASE pyrula_call")
                return
            except sqlite3.Error:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
        self._fail_batch(batch, "SQLite rolled the transaction back")

    def _fail_batch(self, batch: Batch, why: str) -> None:
        batch.open = False
        pending, batch.pending = batch.pending, []
        for call in pending:
            call.value = None
            call.error = StoreUnavailable(f"SQLite store {self.path}: {why}")

    def _run_batch(self, calls: list[Call]) -> None:
        """On the store thread: run ``calls`` in order, those that write in one
        transaction, and commit it before any of them is reported."""
        batch = Batch()
        self._local.batch = batch
        try:
            with self._lock:
                for call in calls:
                    if call.future.done():  # cancelled before it started: skip it
                        continue
                    batch.current = call
                    try:
                        call.value = call.fn()
                    except BaseException as exc:  # the caller's to handle
                        call.error = exc
                batch.current = None
                if batch.open:
                    self._commit_batch(batch)
        finally:
            self._local.batch = None

    def _commit_batch(self, batch: Batch) -> None:
        conn = self._connection()
        try:
            self._commit(conn)
        except (sqlite3.Error, StoreUnavailable) as exc:
            if conn.in_transaction:
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
            self._fail_batch(batch, f"commit failed: {describe(exc)}")
            return
        batch.open = False
        batch.pending = []

    def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        batch = self._batch()
        with self._lock:
            conn = self._connection()
            if batch is not None and batch.open:
                # Inside the batch's transaction: what it reads is only true once that
                # commits, so it is reported with the writes.
                batch.depends()
                try:
                    return fn(conn)
                except sqlite3.OperationalError as exc:
                    if not conn.in_transaction:
                        self._fail_batch(batch, "SQLite rolled the transaction back")
                    raise self._unavailable(exc) from exc
            if batch is not None and batch.inline:
                return self._once(lambda: fn(conn))
            return self._retry_busy(lambda: fn(conn), "reading")

    async def _call(self, fn: Callable[[], T], *, inline: bool = False) -> T:
        """Run ``fn`` with the calls made beside it, in one transaction (see
        sqlite_thread), never waiting for a lock on the event loop.

        ``inline`` (short calls: a state change of one run, a claim, a read of one row)
        lets the calls made during one turn of the loop run on the loop itself, right after
        that turn, when nothing makes them wait: no other thread of this store holds the
        connection and the write lock is free at once. Otherwise, or as soon as one of them
        finds a lock taken, they go to the store thread, which waits. (Calls in flight
        together may so run in another order than they were made; a call made after
        another returned always runs after it.) Only in WAL mode with ``synchronous`` OFF
        or NORMAL, where a commit does not wait for a sync (and the WAL's checkpoints run
        on a thread of their own: Checkpointer).
        """
        loop = asyncio.get_running_loop()
        call = Call(fn, loop, loop.create_future())
        if inline and self._wal and self._synchronous in ("OFF", "NORMAL"):
            queued = self._on_loop.get(loop)
            if queued is None:
                self._on_loop[loop] = [call]
                loop.call_soon(self._run_on_loop, loop)
            else:
                queued.append(call)
        else:
            self._to_thread([call])
        result: T = await call.future
        return result

    def _to_thread(self, calls: list[Call]) -> None:
        with self._thread_lock:
            thread = self._thread
            if thread is None or thread.pid != os.getpid():
                thread = self._thread = StoreThread(self._run_batch)
                weakref.finalize(self, thread.stop_soon)
                self._checkpointer = Checkpointer(
                    self.path, self._synchronous, self.CHECKPOINT_AFTER_S
                )
            # Submitted under the lock: close() detaches the thread under it, so no call
            # lands on a thread that is stopping (the store reopens on next use).
            for call in calls:
                thread.submit(call)

    def _run_on_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        calls = self._on_loop.pop(loop, [])
        try:
            later, blocked = self._run_inline(calls)
        except BaseException as exc:  # a bug here must not leave callers waiting
            for call in calls:
                if not call.future.done():
                    call.future.set_exception(exc)
            raise
        if blocked:
            self._to_thread(blocked)
        if later:  # past this turn's budget: the next turn runs them (with any new ones)
            queued = self._on_loop.get(loop)
            if queued is None:
                self._on_loop[loop] = later
                loop.call_soon(self._run_on_loop, loop)
            else:
                queued[:0] = later

    def _run_inline(self, calls: list[Call]) -> tuple[list[Call], list[Call]]:
        """Run ``calls`` on this loop as the store thread would, within this turn's
        budget; return (those left for the next turn, those that would have to wait: for
        the store thread)."""
        with self._thread_lock:
            if self._checkpointer is None or self._checkpointer.pid != os.getpid():
                self._checkpointer = Checkpointer(
                    self.path, self._synchronous, self.CHECKPOINT_AFTER_S
                )
        if self._conn is None or self._pid != os.getpid():
            return [], calls  # opening the file may wait: the store thread opens it
        if not self._lock.acquire(blocking=False):
            return [], calls  # another thread uses the connection
        batch = Batch(inline=True)
        self._local.batch = batch
        ran: list[Call] = []
        later: list[Call] = []
        blocked: list[Call] = []
        deadline = time.monotonic() + _INLINE_BUDGET_S
        try:
            for index, call in enumerate(calls):
                if len(ran) >= _INLINE_MAX_CALLS or (ran and time.monotonic() > deadline):
                    later = calls[index:]
                    break
                if call.future.done():  # cancelled before it started: skip it
                    continue
                batch.current = call
                try:
                    call.value = call.fn()
                except WouldBlock:
                    blocked = calls[index:]
                    break
                except BaseException as exc:  # the caller's to handle
                    call.error = exc
                ran.append(call)
            batch.current = None
            if batch.open:
                self._commit_batch(batch)
        finally:
            self._local.batch = None
            self._lock.release()
        resolve(ran)
        return later, blocked

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
        """The run's events after seq ``after``; JournalCorrupt for a row that is not one."""
        rows = conn.execute(
            "SELECT seq, data FROM events WHERE run_id=? AND seq>? ORDER BY seq", (run_id, after)
        ).fetchall()
        return [journal_entry(run_id, seq, data) for seq, data in rows]

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

    async def _ended_among(self, run_ids: list[str]) -> dict[str, RunInfo]:
        """Those of ``run_ids`` that have ended (one query per 500 of them)."""

        def op(conn: sqlite3.Connection) -> dict[str, RunInfo]:
            ended: dict[str, RunInfo] = {}
            for i in range(0, len(run_ids), 500):
                chunk = run_ids[i:i + 500]
                for row in conn.execute(
                    f"SELECT {_RUN_COLUMNS} FROM runs WHERE run_id IN "
                    f"({','.join('?' * len(chunk))}) AND status IN ({_TERMINAL})", chunk,
                ):
                    ended[row["run_id"]] = self._info(row)
            return ended

        return await self._call(lambda: self._read(op), inline=True)

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
        with self._thread_lock:
            thread, self._thread = self._thread, None
            checkpointer, self._checkpointer = self._checkpointer, None
        if thread is not None and thread.pid == os.getpid():
            thread.stop()  # outside the lock: the calls in flight take it
        if checkpointer is not None and checkpointer.pid == os.getpid():
            checkpointer.stop()
        with self._lock:
            if self._conn_finalizer is not None:
                self._conn_finalizer.detach()
                self._conn_finalizer = None
            if self._conn is not None and self._pid == os.getpid():
                self._conn.close()
            self._conn = None

    async def aclose(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.close)

    def __repr__(self) -> str:
        return f"SQLiteStore({self.path!r})"


def _close_in(pid: int, conn: sqlite3.Connection) -> None:
    """Close ``conn`` in the process that opened it; never a parent's copy in a forked
    child (closing the inherited file would drop the child's own POSIX locks on it)."""
    if os.getpid() == pid:
        conn.close()
