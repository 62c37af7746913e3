"""The SQLite store's private thread: it runs every async call of one store object in
order, off the event loops that made them, and lets calls queued together share one
transaction (a group commit).

A call that writes runs in its own savepoint inside the batch's transaction (see
``SQLiteBase._tx``), so it is atomic on its own: a call that fails (a stale token, say)
is rolled back to its savepoint and the others go on. Nothing is reported until the
transaction has committed: a call's result reaches its caller only once its writes are
durable, and if the commit fails every call of the batch that wrote (or read inside the
transaction) gets StoreUnavailable. Results go back to each event loop in one wake-up
per batch, not one per call.
"""

from __future__ import annotations

import asyncio
import os
import queue
import sqlite3
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: The most calls one transaction takes: a batch holds the file's write lock while it
#: runs, and other processes wait for it.
MAX_BATCH = 32


@dataclass(slots=True, eq=False)
class Call:
    """One async call of the store, from the loop that awaits ``future``."""

    fn: Callable[[], Any]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]
    value: Any = None
    error: BaseException | None = None


@dataclass(slots=True, eq=False)
class Batch:
    """What the calls of one batch share on the store thread: the open transaction (if a
    call has begun it) and the calls whose outcome depends on its commit."""

    open: bool = False
    #: Run on the caller's event loop: a lock it would wait for raises WouldBlock instead.
    inline: bool = False
    #: Savepoints currently open (a call inside a transaction of the batch).
    depth: int = 0
    current: Call | None = None
    #: Set once the batch gave up waiting for the write lock: its later writes fail at once.
    locked_out: BaseException | None = None
    pending: list[Call] = field(default_factory=list)

    def depends(self) -> None:
        """The current call's outcome stands or falls with the batch's commit."""
        if self.current is not None and (not self.pending or self.pending[-1] is not self.current):
            self.pending.append(self.current)


class WouldBlock(BaseException):  # noqa: N818 - not an error: a change of thread
    """Raised inside a call run on an event loop where it would have to wait for a lock
    (another process's write lock, say): that call and the rest of its batch go to the
    store thread instead, which waits. Only a call that has written nothing yet raises it.
    """


class StoreThread:
    """One thread that runs ``run_batch`` over the calls queued for it, oldest first.

    It holds ``run_batch`` weakly, as the executor it replaces did: a store nobody closed
    and nobody refers to any more is collected, and its thread ends (``stop_soon`` by a
    finalizer of the store).
    """

    def __init__(self, run_batch: Callable[[list[Call]], None]) -> None:
        self.pid = os.getpid()
        self._run_batch: Callable[[], Callable[[list[Call]], None] | None]
        try:
            self._run_batch = weakref.WeakMethod(run_batch)
        except TypeError:  # not a bound method: held as it is
            self._run_batch = lambda: run_batch
        self._queue: queue.SimpleQueue[Call | None] = queue.SimpleQueue()
        # A daemon, like the executors' threads it replaces it must not keep a process
        # alive; a commit cut short at exit is rolled back by SQLite.
        self._thread = threading.Thread(target=self._main, name="pyrula-sqlite", daemon=True)
        self._thread.start()

    def submit(self, call: Call) -> None:
        self._queue.put(call)

    def stop_soon(self) -> None:
        """End the thread once it has run the calls queued so far."""
        self._queue.put(None)

    def stop(self) -> None:
        """Run the calls queued so far, then end the thread (wait for that unless it is
        the caller)."""
        self.stop_soon()
        if threading.current_thread() is not self._thread:
            self._thread.join()

    def _main(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            stopping = False
            while len(batch) < MAX_BATCH:
                try:
                    call = self._queue.get_nowait()
                except queue.Empty:
                    break
                if call is None:
                    stopping = True
                    break
                batch.append(call)
            run_batch = self._run_batch()
            if run_batch is None:  # cannot be while calls hold their store: for mypy
                return
            run_batch(batch)
            del run_batch
            deliver(batch)
            if stopping:
                return


def deliver(calls: list[Call]) -> None:
    """Hand each call's outcome to its loop: one ``call_soon_threadsafe`` per loop."""
    by_loop: dict[asyncio.AbstractEventLoop, list[Call]] = {}
    for call in calls:
        by_loop.setdefault(call.loop, []).append(call)
    for loop, done in by_loop.items():
        try:
            loop.call_soon_threadsafe(resolve, done)
        except RuntimeError:  # that loop is closed: nobody waits for these any more
            pass


def resolve(calls: list[Call]) -> None:
    """Hand each call's outcome to its future (on the futures' own loop)."""
    for call in calls:
        if call.future.done():  # cancelled while it ran
            continue
        if call.error is not None:
            call.future.set_exception(call.error)
        else:
            call.future.set_result(call.value)


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
