"""Where a call of the SQLite store runs: on the store thread, on the caller's event loop
right after the turn that made it, or on a synchronous caller's own thread.

Every operation of the store is a synchronous body (it takes the connection's lock and
runs one transaction or one read) handed to :meth:`Calls.call`:

- while :data:`~pyrula.workflows._sync.SYNC_DRIVE` is set (a synchronous call driven on
  the caller's thread with no event loop) the body runs at once on that thread, in a
  transaction of its own, waiting there for the lock (the connection is shared by every
  thread of the process, guarded by the store's lock): the coroutine never suspends;
- ``inline`` calls (short ones) made during one turn of a loop run on the loop itself,
  right after that turn, when nothing makes them wait;
- the others, and any inline call that finds a lock taken, go to the store thread
  (``thread``), which runs those queued together in one transaction.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import TypeVar

from pyrula.workflows._sync import SYNC_DRIVE
from pyrula.workflows.stores.sqlite.connection import Database
from pyrula.workflows.stores.sqlite.thread import Batch, Call, StoreThread, WouldBlock, resolve

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Calls run on an event loop in one turn: at most this many, for at most this long
#: (the rest run in the next turns), so the loop is never held for long.
_INLINE_MAX_CALLS = 32
_INLINE_BUDGET_S = 0.002


class Calls:
    """Runs the store's calls against ``db`` (see the module docstring)."""

    def __init__(self, db: Database) -> None:
        self.db = db
        #: Guards ``thread`` only (held for no I/O).
        self._thread_lock = threading.Lock()
        self.thread: StoreThread | None = None
        #: Calls made on each event loop since it last ran them.
        self._on_loop: dict[asyncio.AbstractEventLoop, list[Call]] = {}

    async def call(self, fn: Callable[[], T], *, inline: bool = False) -> T:
        """Run ``fn`` with the calls made beside it, in one transaction, never waiting for
        a lock on the event loop.

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
        if SYNC_DRIVE.get():
            # A synchronous caller's thread, with no loop to keep turning: it may wait
            # for the lock itself, as the store thread does. Its own transaction: nothing
            # else is batched with it, and it has committed when fn returns.
            return fn()
        loop = asyncio.get_running_loop()
        call = Call(fn, loop, loop.create_future())
        if inline and not self.db.commits_wait_for_sync:
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

    def stop(self) -> None:
        """Finish the calls queued on the store thread and end it (the next call starts
        another)."""
        with self._thread_lock:
            thread, self.thread = self.thread, None
        if thread is not None and thread.pid == os.getpid():
            thread.stop()  # outside the lock: the calls in flight take it

    def _to_thread(self, calls: list[Call]) -> None:
        with self._thread_lock:
            thread = self.thread
            if thread is None or thread.pid != os.getpid():
                thread = self.thread = StoreThread(self._run_batch)
                weakref.finalize(self, thread.stop_soon)
                self.db.start_checkpoints()
            # Submitted under the lock: stop() detaches the thread under it, so no call
            # lands on a thread that is stopping (the store reopens on next use).
            for call in calls:
                thread.submit(call)

    def _run_batch(self, calls: list[Call]) -> None:
        """On the store thread: run ``calls`` in order, those that write in one
        transaction, and commit it before any of them is reported."""
        with self.db.running(Batch()) as batch, self.db.lock:
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
                self.db.commit_batch(batch)

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
        db = self.db
        db.start_checkpoints()
        if not db.is_open():
            return [], calls  # opening the file may wait: the store thread opens it
        if not db.lock.acquire(blocking=False):
            return [], calls  # another thread uses the connection
        ran: list[Call] = []
        later: list[Call] = []
        blocked: list[Call] = []
        deadline = time.monotonic() + _INLINE_BUDGET_S
        try:
            with db.running(Batch(inline=True)) as batch:
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
                    db.commit_batch(batch)
        finally:
            db.lock.release()
        resolve(ran)
        return later, blocked
