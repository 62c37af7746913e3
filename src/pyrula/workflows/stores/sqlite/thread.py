"""The SQLite store's private thread: it runs every async call of one store object in
order, off the event loops that made them, and lets calls queued together share one
transaction (a group commit).

A call that writes runs in its own savepoint inside the batch's transaction (see
``Database.tx``), so it is atomic on its own: a call that fails (a stale token, say)
is rolled back to its savepoint and the others go on. Nothing is reported until the
transaction has committed: a call's result reaches its caller only once its writes are
durable, and if the commit fails every call of the batch that wrote (or read inside the
transaction) gets StoreUnavailable. Results go back to each event loop in one wake-up
per batch, not one per call.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import sys
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)

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
        try:
            self._serve()
        except BaseException:
            # A daemon cut short while the interpreter exits (what it touches is being
            # torn down): its callers are gone, and a traceback would be noise after the
            # process's own last line. Anything else is a bug: raised as usual.
            if sys.is_finalizing():
                return
            raise

    def _serve(self) -> None:
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

