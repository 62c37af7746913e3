"""One background event loop per process, for the synchronous facades.

``SyncWorkflowClient`` and the stores' synchronous admin calls run their async
implementation here, so there is a single implementation of each operation.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_thread: threading.Thread | None = None
_pid: int | None = None


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

