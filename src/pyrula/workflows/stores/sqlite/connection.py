"""The SQLite store's connection: one per process, opened on first use, guarded by one
lock; the transaction helper every state change goes through; and the mapping of
SQLite's failures (a lock held elsewhere, a full or failing disk) to StoreUnavailable.

Which thread runs a call (the store thread, an event loop, a synchronous caller) is
``calls``'s business: here a call finds the batch it is part of, if any, in a
thread-local (:meth:`Database.running`).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar

from pyrula.workflows.errors import ConfigurationError, StoreUnavailable
from pyrula.workflows.stores.sqlite.checkpoint import Checkpointer
from pyrula.workflows.stores.sqlite.schema import migrate
from pyrula.workflows.stores.sqlite.thread import Batch, WouldBlock

logger = logging.getLogger(__name__)

T = TypeVar("T")

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
#: Failures of the disk under the file, not of the statement: a call that meets one is
#: reported as StoreUnavailable (the worker puts its run back; nothing was written).
_DISK_ERRORS = frozenset({sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_CANTOPEN})


class Synchronous(StrEnum):
    """SQLite's ``synchronous`` setting: when a commit waits for the disk."""

    OFF = "OFF"
    NORMAL = "NORMAL"  # WAL: a commit survives a crash of the process, not a power loss
    FULL = "FULL"  # a commit survives a power loss too
    EXTRA = "EXTRA"


def _primary_code(exc: BaseException) -> int | None:
    code = getattr(exc, "sqlite_errorcode", None)
    return None if code is None else int(code) & 0xFF


def _is_busy(exc: sqlite3.Error) -> bool:
    code = _primary_code(exc)
    if code is not None:
        return code == _SQLITE_BUSY
    return "locked" in str(exc)


def describe(exc: BaseException) -> str:
    """An SQLite failure in words, the underlying sqlite3 error's once (not the wrappers'),
    saying so plainly when the disk is full."""
    while isinstance(exc, StoreUnavailable) and isinstance(exc.__cause__, sqlite3.Error):
        exc = exc.__cause__
    if _primary_code(exc) == sqlite3.SQLITE_FULL:
        return f"the disk is full ({exc}): nothing was written; free space on it"
    return str(exc)


class Database:
    """One SQLite file in WAL mode, as this process's one connection to it sees it."""

    #: A checkpoint runs on a thread of its own this long after a commit (see Checkpointer).
    CHECKPOINT_AFTER_S = 0.1

    def __init__(self, path: str, *, busy_timeout: float, synchronous: str) -> None:
        if not path or path == ":memory:":
            raise ConfigurationError(
                "SQLiteStore needs a file path (use MemoryStore for an in-memory store)"
            )
        try:
            self.synchronous = Synchronous(synchronous.upper())
        except ValueError:
            raise ConfigurationError(
                f"synchronous must be OFF, NORMAL, FULL or EXTRA, got {synchronous!r}"
            ) from None
        self.path = str(Path(path).expanduser())
        self.busy_ms = int(busy_timeout * 1000)
        #: Guards the connection; held by a transaction (or a whole batch) and by reads.
        #: Never waited for on an event loop.
        self.lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None
        #: Closes the connection if the store is collected without ``close()`` (Python
        #: 3.13 warns of a connection collected open, and it holds the file meanwhile).
        self._conn_finalizer: weakref.finalize[Any, Any] | None = None
        self.pid = os.getpid()
        #: The file is in WAL mode (known once the connection is open).
        self.wal = False
        #: The connection's wal_autocheckpoint (pages), as commit() set it.
        self._autocheckpoint = _AUTOCHECKPOINT
        #: Guards ``_checkpointer`` only (held for no I/O).
        self._checkpointer_lock = threading.Lock()
        self._checkpointer: Checkpointer | None = None
        #: The batch this thread is running (the store thread, or a loop running its calls).
        self._local = threading.local()

    @property
    def commits_wait_for_sync(self) -> bool:
        """A commit waits for the disk: not in WAL mode, or ``synchronous`` FULL or EXTRA."""
        return not (self.wal and self.synchronous in (Synchronous.OFF, Synchronous.NORMAL))

    def is_open(self) -> bool:
        """This process has the connection open (using it needs no file to be opened)."""
        return self._conn is not None and self.pid == os.getpid()

    def connection(self) -> sqlite3.Connection:
        if self._conn is not None and self.pid == os.getpid():
            return self._conn
        # A forked child must never reuse its parent's connection (nor its thread: the
        # calls start a new one).
        self.pid = os.getpid()
        directory = os.path.dirname(os.path.abspath(self.path))
        if not os.path.isdir(directory):
            raise ConfigurationError(f"SQLite store directory does not exist: {directory}")
        try:
            conn = sqlite3.connect(
                self.path, timeout=self.busy_ms / 1000, isolation_level=None,
                check_same_thread=False,
            )
        except sqlite3.DatabaseError as exc:
            raise StoreUnavailable(f"cannot open SQLite store {self.path}: {exc}") from exc
        try:
            conn.execute(f"PRAGMA busy_timeout={self.busy_ms}")
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()
            self.wal = mode is not None and str(mode[0]).lower() == "wal"
            conn.execute(f"PRAGMA wal_autocheckpoint={_AUTOCHECKPOINT}")
            self._autocheckpoint = _AUTOCHECKPOINT
            conn.execute(f"PRAGMA synchronous={self.synchronous}")
            conn.execute("PRAGMA foreign_keys=OFF")
            conn.row_factory = sqlite3.Row
            migrate(conn, self.path)
            # From here on a lock held by another process is waited for by _begin and
            # read(), in finer steps than SQLite's own busy handler takes.
            conn.execute("PRAGMA busy_timeout=0")
        except BaseException as exc:
            conn.close()  # refused (a newer schema, say): the file is not held open
            if isinstance(exc, sqlite3.DatabaseError):
                raise StoreUnavailable(
                    f"cannot open SQLite store {self.path}: {describe(exc)}") from exc
            raise
        self._conn = conn
        self._conn_finalizer = weakref.finalize(self, _close_in, self.pid, conn)
        # Not at exit: a daemon thread may still be using it then, and the process's end
        # closes it anyway.
        self._conn_finalizer.atexit = False
        return conn

    def start_checkpoints(self) -> None:
        """From now on this process's commits leave the WAL's checkpoints to a
        Checkpointer (the store's calls run off their callers' threads)."""
        with self._checkpointer_lock:
            if self._checkpointer is None or self._checkpointer.pid != os.getpid():
                self._checkpointer = Checkpointer(
                    self.path, self.synchronous, self.CHECKPOINT_AFTER_S
                )

    # --- waiting for locks ----------------------------------------------------------

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
                    raise self.unavailable(exc) from exc
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self.busy_ms / 1000
                if now >= deadline:
                    raise StoreUnavailable(
                        f"SQLite store {self.path} is locked ({what}): {exc}"
                    ) from exc
                time.sleep(min(delay, deadline - now))
                delay = min(delay * 2, _BUSY_SLEEP_MAX)

    def _once(self, attempt: Callable[[], T]) -> T:
        """``attempt()`` on an event loop: WouldBlock instead of waiting for a lock."""
        try:
            return attempt()
        except sqlite3.OperationalError as exc:
            if _is_busy(exc):
                raise WouldBlock from exc
            raise self.unavailable(exc) from exc

    def _begin(self, conn: sqlite3.Connection, batch: Batch | None = None) -> None:
        if batch is not None and batch.inline:
            self._once(lambda: conn.execute("BEGIN IMMEDIATE"))
            return
        self._retry_busy(lambda: conn.execute("BEGIN IMMEDIATE"), "waiting for its write lock")

    def commit(self, conn: sqlite3.Connection) -> None:
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

    def unavailable(self, exc: BaseException, what: str = "") -> StoreUnavailable:
        return StoreUnavailable(f"SQLite store {self.path}: {what}{describe(exc)}")

    # --- transactions ---------------------------------------------------------------

    def batch(self) -> Batch | None:
        batch: Batch | None = getattr(self._local, "batch", None)
        return batch

    @contextmanager
    def running(self, batch: Batch) -> Iterator[Batch]:
        """While in the block, this thread's calls are part of ``batch``."""
        self._local.batch = batch
        try:
            yield batch
        finally:
            self._local.batch = None

    @contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """One state change, atomic: its own transaction, or in a batch its own savepoint
        in the batch's transaction (committed before any call of the batch returns). A
        statement the disk fails (full, an I/O error) is StoreUnavailable."""
        batch = self.batch()
        with self.lock:
            conn = self.connection()
            try:
                if batch is None:
                    with self._own_tx(conn):
                        yield conn
                else:
                    with self._savepoint(conn, batch):
                        yield conn
            except sqlite3.OperationalError as exc:
                if _primary_code(exc) in _DISK_ERRORS:
                    raise self.unavailable(exc) from exc
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
            self.commit(conn)
        except (sqlite3.Error, StoreUnavailable) as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise self.unavailable(exc, "commit failed: ") from exc

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

    def commit_batch(self, batch: Batch) -> None:
        """Commit the batch's transaction; if that fails, every call that depended on it
        fails with StoreUnavailable (and the transaction is rolled back)."""
        conn = self.connection()
        try:
            self.commit(conn)
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

    def read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """``fn(conn)`` outside any write of its own (inside the batch's transaction if
        one is open: its outcome is then reported with the batch's writes)."""
        batch = self.batch()
        with self.lock:
            conn = self.connection()
            if batch is not None and batch.open:
                # Inside the batch's transaction: what it reads is only true once that
                # commits, so it is reported with the writes.
                batch.depends()
                try:
                    return fn(conn)
                except sqlite3.OperationalError as exc:
                    if not conn.in_transaction:
                        self._fail_batch(batch, "SQLite rolled the transaction back")
                    raise self.unavailable(exc) from exc
            if batch is not None and batch.inline:
                return self._once(lambda: fn(conn))
            return self._retry_busy(lambda: fn(conn), "reading")

    def close(self) -> None:
        """Stop the checkpoints and close the connection (a later use reopens it)."""
        with self._checkpointer_lock:
            checkpointer, self._checkpointer = self._checkpointer, None
        if checkpointer is not None and checkpointer.pid == os.getpid():
            checkpointer.stop()
        with self.lock:
            if self._conn_finalizer is not None:
                self._conn_finalizer.detach()
                self._conn_finalizer = None
            if self._conn is not None and self.pid == os.getpid():
                self._conn.close()
            self._conn = None


def _close_in(pid: int, conn: sqlite3.Connection) -> None:
    """Close ``conn`` in the process that opened it; never a parent's copy in a forked
    child (closing the inherited file would drop the child's own POSIX locks on it)."""
    if os.getpid() == pid:
        conn.close()
