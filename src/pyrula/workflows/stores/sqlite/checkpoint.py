"""The SQLite store's checkpoints: the WAL copied back into the database file on a
thread of its own, so no commit of the store pays for one."""

from __future__ import annotations

import logging
import os
import sqlite3
import threading

logger = logging.getLogger(__name__)


class Checkpointer:
    """Copies the WAL back into the database file (a PASSIVE checkpoint, with the fsyncs
    ``synchronous`` asks for) on a thread and connection of its own, ``interval`` seconds
    after this process last committed.

    SQLite's automatic checkpoint runs inside the COMMIT that finds ``wal_autocheckpoint``
    (1,000) pages in the WAL: that commit then copies them and syncs twice (tens of ms),
    holding every call queued behind it (or, for calls run on an event loop, the loop).
    While this thread is healthy the store turns the automatic checkpoint off on its
    connection; after ``FAILURES`` failed checkpoints in a row ``failed`` is true and the
    store turns it back on, until a checkpoint here succeeds again. Under
    ``synchronous=NORMAL`` a checkpoint is also when the WAL is synced: this one comes
    ``interval`` after a commit, the automatic one only once 1,000 pages have gathered.
    A checkpoint never waits for a lock (another process checkpointing: this one skips).
    The thread starts with the first commit and ends after ``IDLE_S`` without one.
    """

    FAILURES = 3
    IDLE_S = 5.0

    def __init__(self, path: str, synchronous: str, interval: float) -> None:
        self.pid = os.getpid()
        self._path = path
        self._synchronous = synchronous
        self._interval = interval
        self._dirty = threading.Event()
        self._stop = threading.Event()
        self._failures = 0
        self._start_lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @property
    def failed(self) -> bool:
        """Checkpoints here keep failing: the store falls back on SQLite's automatic
        checkpoint."""
        return self._failures >= self.FAILURES

    def committed(self) -> None:
        """This process committed a transaction: checkpoint ``interval`` from now."""
        if not self._dirty.is_set():
            self._dirty.set()
        with self._start_lock:  # an idle thread ends under this lock, looking at _dirty
            thread = self._thread
            if (thread is None or not thread.is_alive()) and not self._stop.is_set():
                self._thread = threading.Thread(
                    target=self._main, name="pyrula-sqlite-checkpoint", daemon=True
                )
                self._thread.start()

    def stop(self) -> None:
        self._stop.set()  # before _dirty: _main looks at _stop after each wake-up
        self._dirty.set()
        with self._start_lock:
            thread = self._thread
        if thread is not None and threading.current_thread() is not thread:
            thread.join()

    def _main(self) -> None:
        conn: sqlite3.Connection | None = None
        try:
            while True:
                if not self._dirty.wait(self.IDLE_S):
                    with self._start_lock:  # idle: end (a commit starts a new thread)
                        if not self._dirty.is_set():
                            self._thread = None
                            return
                if self._stop.is_set() or self._stop.wait(self._interval):
                    return
                self._dirty.clear()
                if self._stop.is_set():  # stop() may have set _dirty just before
                    return
                try:
                    if conn is None:
                        conn = sqlite3.connect(
                            self._path, isolation_level=None, check_same_thread=False
                        )
                        conn.execute("PRAGMA busy_timeout=0")
                        conn.execute(f"PRAGMA synchronous={self._synchronous}")
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                    self._failures = 0
                except sqlite3.Error:  # the automatic checkpoint covers meanwhile
                    self._failures += 1
                    self._dirty.set()  # try again after the interval
                    if conn is not None:
                        conn.close()
                    conn = None
        except BaseException:
            self._failures = self.FAILURES
            raise
        finally:
            if conn is not None:
                conn.close()
