"""Lock renewal on its own thread, and blocked-event-loop detection.

The thread renews the locks of every run the worker holds in one store call every
``lock_ttl / 3`` seconds. The event loop stamps a heartbeat; while the loop is blocked the
thread keeps renewing, up to each run's liveness bound ``max(3 × lock_ttl, timeout)``.
Past it, every run on the loop stands down (requeued with reason ``loop_blocked``) and
only the run whose code was running when the block was found is charged a crash
(``run_attempt_loop_blocked``); the stand-down is written from this thread, with the
attempt's own fencing token, so the attempt's later writes are refused, and the attempt is
told at once (``HeldRuns.stand_down``) so that it starts no further step once the loop turns.

The runs to renew are read from the worker's registry of held runs (``worker.held``),
which is keyed by run id *and* token.

A heartbeat is only evidence against the loop if the loop could have run. When the whole
process was suspended (SIGSTOP, a paused VM or container), this thread wakes late too,
having used next to no CPU meanwhile; the loop then gets a fresh liveness window from the
moment the process resumed, instead of having every run stood down as ``loop_blocked``.
A C call that holds the GIL also makes this thread late, but burns CPU while it does, so
it is still found when it returns.

Whose code was running is read from the loop's current task (``running_run``): on Python
3.12 and later a task the run started (a ``gather`` leg, an agent's tool call) is charged to
the run, through the context it inherited; on 3.11 only the run's own tasks (its body and
async steps, named by the engine) are, and a block in another task charges no run.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from pyrula.errors import StaleToken, StoreUnavailable, WorkflowNotFound
from pyrula.metrics import Metrics
from pyrula.workflows.clock import Clock
from pyrula.workflows.engine import RUN_TASK_PREFIX, RUNNING_RUN
from pyrula.workflows.records import PoisonPolicy
from pyrula.workflows.stores.base import Store
from pyrula.workflows.worker.held import Held, HeldRuns

logger = logging.getLogger(__name__)


def was_suspended(late_s: float, cpu_s: float, interval_s: float) -> bool:
    """True if a renewal wake-up ``late_s`` seconds past its time, while the process used
    ``cpu_s`` seconds of CPU, means the process was suspended rather than busy."""
    return late_s > interval_s and cpu_s < late_s / 2


def running_run(task: asyncio.Task[object] | None) -> str | None:
    """The run whose code ``task`` runs: on Python 3.12 and later, the run its context
    names (``RUNNING_RUN``), so a task the run started is the run's too; else, and on 3.11
    (no ``Task.get_context``), the run its name names (only the engine's own tasks: the
    body and async steps).

    Called from the renewal thread with the loop's current task, found with
    ``asyncio.current_task(loop)``: up to 3.13 one lookup of the loop in the current-task
    mapping, atomic under the GIL; from 3.14 a search of the thread states made for callers
    on other threads. The task's context is an immutable mapping, read the same way.
    """
    if task is None:
        return None
    if sys.version_info >= (3, 12):
        run_id = task.get_context().get(RUNNING_RUN)
        if run_id is not None:
            return run_id
    name = task.get_name()
    return name[len(RUN_TASK_PREFIX):] if name.startswith(RUN_TASK_PREFIX) else None


@dataclass(frozen=True, slots=True)
class RenewalSettings:
    """What the renewal thread renews with, and how it stands a blocked loop's runs down."""

    worker_id: str
    lock_ttl: float
    poison: PoisonPolicy
    #: Whether the run whose code blocked the loop is charged a crash (``pyrula dev``: no).
    charge_loop_blocked: bool
    log_extra: Mapping[str, str]


class LoopWatch(Protocol):
    """What the renewal thread reads of the event loop it watches."""

    def last_beat(self) -> float:
        """When the event loop last stamped its heartbeat (``time.monotonic()``)."""
        ...


class LockRenewer:
    """Owns the renewal thread: renews the locks of ``runs`` and stands them down when the
    event loop ``loop`` (watched through ``watch``) stays blocked past their bound."""

    def __init__(
        self,
        *,
        store: Store,
        clock: Clock,
        loop: asyncio.AbstractEventLoop,
        settings: RenewalSettings,
        runs: HeldRuns,
        watch: LoopWatch,
        metrics: Metrics | None = None,
    ) -> None:
        self.runs = runs
        self._metrics = metrics
        self._store = store
        self._clock = clock
        self._loop = loop
        self._settings = settings
        self._watch = watch
        self._worker_id = settings.worker_id
        self._lock_ttl = settings.lock_ttl
        self._extra = settings.log_extra
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="pyrula-lock-renewal", daemon=True)
        self.failures = 0
        #: When the process last resumed from a suspension (monotonic); the loop's
        #: liveness is measured from here if its heartbeat is older.
        self.resumed_at = float("-inf")

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _main(self) -> None:
        loop = asyncio.new_event_loop()
        try:
            interval = max(0.05, self._lock_ttl / 3)
            while True:
                slept_at, cpu = time.monotonic(), time.process_time()
                if self._stop.wait(interval):
                    return
                self._check_suspended(slept_at, cpu, interval)
                try:
                    loop.run_until_complete(self.tick())
                except Exception:  # never let the renewal thread die
                    self.failures += 1
                    logger.exception("lock renewal failed", extra=self._extra)
        finally:
            try:
                loop.run_until_complete(self._store.aclose())
            except Exception:  # closing is best effort; the thread is ending anyway
                logger.debug("closing the renewal thread's store client failed", exc_info=True)
            loop.close()

    def _check_suspended(self, slept_at: float, cpu: float, interval: float) -> None:
        now = time.monotonic()
        late = now - slept_at - interval
        used = time.process_time() - cpu
        if was_suspended(late, used, interval):
            self.resumed_at = now
            logger.warning(
                "worker_resumed: the process was suspended for about %.1f s (%.2f s of CPU "
                "used meanwhile); not counted against the event loop", late, used,
                extra={"event": "worker_resumed", "suspended_s": round(late, 3),
                       **self._extra},
            )

    async def tick(self) -> None:
        lag = time.monotonic() - max(self._watch.last_beat(), self.resumed_at)
        held = self.runs.renewing()
        blocked = {r: h for r, h in held.items() if lag > h.liveness_bound_s}
        if blocked:
            await self._stand_down(blocked, lag)
            held = {r: h for r, h in held.items() if r not in blocked}
        if not held:
            return
        try:
            result = await self._store.renew(
                self._worker_id, {r: h.token for r, h in held.items()},
                now=self._clock.now(), lock_ttl=self._lock_ttl,
            )
        except StoreUnavailable:
            self.failures += 1
            return
        for run_id in result.cancel_requested:
            self._loop.call_soon_threadsafe(self.runs.request_cancel, run_id)
        # A lock found gone (another attempt owns the run): stop starting steps now rather
        # than at the attempt's next write, which write-behind may put several steps away.
        for run_id in result.lost:
            lost = held.get(run_id)
            if lost is not None:
                self.runs.lost(run_id, lost.token)

    def _running_run(self) -> str | None:
        """The run whose code holds the blocked loop, or None if it is no run's code."""
        return running_run(asyncio.current_task(self._loop))

    async def _stand_down(self, blocked: dict[str, Held], lag: float) -> None:
        culprit = self._running_run()
        for run_id, held in blocked.items():
            charged = run_id == culprit
            detail = {
                "cause": "loop_blocked",
                "blocked_for_s": round(lag, 3),
                "liveness_bound_s": held.liveness_bound_s,
                "worker": self._worker_id,
            }
            try:
                outcome = await self._store.requeue(
                    run_id, held.token, now=self._clock.now(), reason="loop_blocked",
                    crash=charged and self._settings.charge_loop_blocked,
                    poison=self._settings.poison, crash_detail=detail,
                )
            except (StaleToken, WorkflowNotFound, StoreUnavailable):
                outcome = None
            self.runs.stand_down(run_id, held.token)
            if outcome is not None and not outcome.quarantined and self._metrics is not None:
                self._metrics.inc("pyrula.workflows.runs.requeued", reason="loop_blocked")
            if charged:
                logger.error(
                    "run_attempt_loop_blocked: run %s blocked the event loop for %.1f s "
                    "(liveness bound %.1f s); stood down%s", run_id, lag,
                    held.liveness_bound_s,
                    " and quarantined" if outcome is not None and outcome.quarantined else "",
                    extra={"event": "run_attempt_loop_blocked", "run_id": run_id,
                           "blocked_for_s": round(lag, 3), **self._extra},
                )
            else:
                logger.warning(
                    "run %s stood down: the event loop was blocked for %.1f s by other code",
                    run_id, lag, extra={"event": "run_stood_down", "run_id": run_id,
                                        **self._extra},
                )
