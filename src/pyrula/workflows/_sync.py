"""Synchronous calls into the async implementation: one implementation of each operation.

Two ways, chosen by the store:

- :func:`drive` runs the coroutine to completion on the calling thread, with no event loop.
  It is for stores whose I/O has a blocking twin that never suspends (the Valkey store's
  sockets): while :data:`SYNC_DRIVE` is set, such a store uses blocking connections of the
  calling thread, so ``await`` never yields and ``coro.send(None)`` finishes the call.
- :func:`run_sync` runs the coroutine on one background event loop per process and blocks
  the calling thread until it finishes: for stores built on asyncio primitives.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Coroutine
from contextvars import ContextVar
from typing import Any, TypeVar

T = TypeVar("T")

#: Set while :func:`drive` runs a coroutine: the store must not suspend on an event loop.
SYNC_DRIVE: ContextVar[bool] = ContextVar("pyrula_sync_drive", default=False)

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_thread: threading.Thread | None = None
_pid: int | None = None


def drive(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on this thread to its end; it must never suspend.

    Raises RuntimeError if it tries to (an operation of a store that has no blocking path).
    """
    token = SYNC_DRIVE.set(True)
    try:
        try:
            yielded = coro.send(None)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        coro.close()
        raise RuntimeError(
            f"a synchronous call needed an event loop (it awaited {yielded!r}); "
            "this store has no blocking path for it"
        )
    finally:
        SYNC_DRIVE.reset(token)


def _background_loop() -> asyncio.AbstractEventLoop:
    global _loop, _thread, _pid
    with _lock:
        if _loop is None or _pid != os.getpid() or not (_thread and _thread.is_alive()):
            loop = asyncio.new_event_loop()
            thread = threading.Thread(
                target=loop.run_forever, name="pyrula-sync-facade", daemon=True
            )
            thread.start()
            _loop, _thread, _pid = loop, thread, os.getpid()
        return _loop


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on the background loop and block this thread until it finishes."""
    loop = _background_loop()
    if threading.current_thread() is _thread:
        coro.close()
        raise RuntimeError("a synchronous pyrula call was made from pyrula's own facade loop")
    return asyncio.run_coroutine_threadsafe(coro, loop).result()
