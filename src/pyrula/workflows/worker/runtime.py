"""What a worker's loops and attempts share: its state, its stop, its store-failure stamp.

Everything here lives on the worker's event loop, except ``stop()`` (safe from a signal
handler, a coroutine or a thread) and ``last_beat()`` (read by the renewal thread).
"""

from __future__ import annotations

import asyncio
import logging
import time

from pyrula.wire import WorkerState
from pyrula.workflows.worker.loops import LoopState

logger = logging.getLogger(__name__)

HEARTBEAT_INTERVAL_S = 0.1


class Runtime:
    """The worker's shared state: one per worker."""

    def __init__(self) -> None:
        self.state = WorkerState.STARTING
        #: Starting, and the store has not answered yet (``store_wait``).
        self.store_waiting = False
        self.stop_requested = False
        #: False while the store is bound to another project or environment.
        self.binding_ok = True
        #: An upgrade's older generation: it claims nothing new (``worker.generations``).
        self.retiring = False
        #: The error that stopped the worker (``run()`` re-raises it).
        self.fatal: BaseException | None = None
        #: The loop that raised it, if a loop did (what the probes name as failed).
        self.died: str | None = None
        self.loops: dict[str, LoopState] = {}
        self.stopping = asyncio.Event()
        #: Set when the worker starts serving (``mark_ready``). Made here, not by
        #: ``start``: a caller may wait on it before ``run()`` begins.
        self.serving = asyncio.Event()
        #: Set whenever an attempt ends (a slot is free).
        self.capacity = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._beat = time.monotonic()
        self._store_failed_at = float("-inf")

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Bind to the event loop ``run()`` serves on."""
        self._loop = loop
        self.stopping = asyncio.Event()
        self.capacity = asyncio.Event()
        if self.stop_requested:
            self.stopping.set()

    def mark_ready(self) -> None:
        """The worker serves: its state is ``ready`` and ``serving`` is set."""
        self.state = WorkerState.READY
        self.serving.set()

    @property
    def paused(self) -> bool:
        """True while the worker must start no new work (draining, retiring, or bound
        elsewhere)."""
        return self.stop_requested or self.retiring or not self.binding_ok

    def stop(self) -> None:
        """Begin the graceful shutdown; safe from a signal handler, a coroutine or a thread."""
        self.stop_requested = True
        if self.state in (WorkerState.STARTING, WorkerState.READY):
            self.state = WorkerState.DRAINING
        loop, stopping = self._loop, self.stopping
        if loop is not None and not loop.is_closed():
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is loop:
                stopping.set()
            else:
                loop.call_soon_threadsafe(stopping.set)

    def fail(self, exc: BaseException, loop: str | None = None) -> None:
        """Stop the worker for ``exc``, raised by ``loop`` if a loop raised it (the first
        such error is the one re-raised)."""
        if self.fatal is None:
            self.fatal = exc
            self.died = loop
        self.stop()

    # --- the store's health ---------------------------------------------------------

    def store_failed(self) -> None:
        self._store_failed_at = time.monotonic()

    def store_failed_within(self, seconds: float) -> bool:
        """Whether a store call of this worker failed within the last ``seconds``."""
        return time.monotonic() - self.last_store_failure() < seconds

    def last_store_failure(self) -> float:
        """When a store call of this worker last failed (monotonic; -inf: never)."""
        times = [self._store_failed_at] + [
            s.last_failed for s in self.loops.values() if s.last_failed is not None]
        return max(times)

    # --- the loop's heartbeat -------------------------------------------------------

    def last_beat(self) -> float:
        """When the event loop last stamped its heartbeat (monotonic)."""
        return self._beat

    async def beat(self) -> None:
        """Stamped by the event loop itself: proof for /livez and the watchdog that it turns."""
        while True:
            self._beat = time.monotonic()
            await asyncio.sleep(HEARTBEAT_INTERVAL_S)
