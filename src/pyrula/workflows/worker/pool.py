"""The bounded pool of daemon threads that runs sync steps, and its saturation signal.

Threads are daemons on purpose: a hung sync step must not keep the process alive after
shutdown (``worker_thread_calls_still_running``), which ThreadPoolExecutor's non-daemon,
joined-at-exit threads would.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

logger = logging.getLogger("pyrula.workflows.worker")

_Work = tuple["Future[Any] | _LoopCall", Callable[..., Any], tuple[Any, ...], dict[str, Any]]


def default_pool_size() -> int:
    return min(32, (os.cpu_count() or 1) + 4)


#: Seconds between two ``user_code_threads_saturated`` warnings of one pool: a full pool
#: under a backlog is the pool working, so it is counted (``saturations``) and said at most
#: once a minute, with the count.
SATURATION_LOG_INTERVAL_S = 60.0


class _LoopCall:
    """A call whose outcome goes back to an asyncio future on ``loop`` (``run_async``)."""

    __slots__ = ("_done", "future", "loop", "started")

    def __init__(self, loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any],
                 done: Callable[[], None]) -> None:
        self.loop = loop
        self.future = future
        self._done: Callable[[], None] | None = done
        #: Set by the thread (under the pool's lock) once the call began.
        self.started = False

    def done(self) -> None:
        """Call ``done`` once (on the loop): when the thread returned, or when the future
        was cancelled first (the call then never begins)."""
        done, self._done = self._done, None
        if done is not None:
            done()


class StepPool(Executor):
    """At most ``max_workers`` daemon threads; knows how many calls run.

    Each time every thread becomes busy and another call has to wait counts one
    saturation (``saturations``, and ``on_saturated`` is called); the warning
    ``user_code_threads_saturated`` is logged at the first, then at most once every
    SATURATION_LOG_INTERVAL_S with the count since the last.
    """

    def __init__(self, max_workers: int | None = None, worker_id: str = "", *,
                 on_saturated: Callable[[], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.size = max_workers or default_pool_size()
        self._queue: queue.SimpleQueue[_Work | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._busy = 0
        self._saturated = False
        self._shutdown = False
        self._worker_id = worker_id
        self._on_saturated = on_saturated
        self._clock = clock
        #: Times every thread was busy and a call had to wait.
        self.saturations = 0
        self._logged_at: float | None = None
        self._logged_count = 0
        self.all_idle = threading.Event()
        self.all_idle.set()
        #: Outcomes of ``run_async`` calls not yet handed to their loop, and whether a
        #: hand-over is already due there (one wake-up of the loop carries them all).
        self._back: list[tuple[_LoopCall, bool, Any]] = []
        self._back_due = False

    @property
    def busy(self) -> int:
        with self._lock:
            return self._busy

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        self._enqueue((future, fn, args, kwargs))
        return future

    def run_async(self, loop: asyncio.AbstractEventLoop, fn: Callable[[], Any],
                  done: Callable[[], None]) -> asyncio.Future[Any]:
        """Run ``fn`` on a thread; its outcome sets the returned future on ``loop``, and
        ``done`` is called there first (once the thread returned, or at once if the future
        was cancelled before the call began, which then never runs). Outcomes that come
        while the loop is busy go back together, on one wake-up of the loop, rather than
        one wake-up (or two, through ``asyncio.wrap_future``) each."""
        future: asyncio.Future[Any] = loop.create_future()
        call = _LoopCall(loop, future, done)
        future.add_done_callback(lambda f: self._given_up(call) if f.cancelled() else None)
        self._enqueue((call, fn, (), {}))
        return future

    def _enqueue(self, work: _Work) -> None:
        with self._lock:
            if self._shutdown:
                raise RuntimeError("the sync-step pool is shut down")
            if self._busy >= self.size and not self._saturated:
                self._saturated = True
                self._saturation()
            self._busy += 1
            self.all_idle.clear()
            # One thread per call in flight, up to the size: counting idle threads instead
            # would let two calls submitted together both count one idle thread, and the
            # second wait behind the first (a deadlock if the first waits on the second).
            if self._busy > len(self._threads) and len(self._threads) < self.size:
                thread = threading.Thread(
                    target=self._work, name=f"pyrula-step-{len(self._threads)}", daemon=True
                )
                self._threads.append(thread)
                thread.start()
        self._queue.put(work)

    def _saturation(self) -> None:
        """Count one saturation; warn if none was said for SATURATION_LOG_INTERVAL_S."""
        self.saturations += 1
        if self._on_saturated is not None:
            self._on_saturated()
        now = self._clock()
        if self._logged_at is not None and now - self._logged_at < SATURATION_LOG_INTERVAL_S:
            return
        since = self.saturations - self._logged_count
        self._logged_at, self._logged_count = now, self.saturations
        logger.warning(
            "user_code_threads_saturated: all %d sync-step threads were busy (%d time%s "
            "since the last report); further sync steps waited for a thread. Under a "
            "backlog that is the pool working; if steps wait on I/O, more threads may help",
            self.size, since, "" if since == 1 else "s",
            extra={"event": "user_code_threads_saturated", "worker_id": self._worker_id,
                   "saturations": since},
        )

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            future, fn, args, kwargs = item
            try:
                if isinstance(future, _LoopCall):
                    self._run_for_loop(future, fn)
                elif future.set_running_or_notify_cancel():
                    try:
                        future.set_result(fn(*args, **kwargs))
                    except BaseException as exc:  # handed to the awaiting step
                        future.set_exception(exc)
            finally:
                with self._lock:
                    self._busy -= 1
                    if self._busy < self.size:
                        self._saturated = False
                    if self._busy == 0:
                        self.all_idle.set()

    def _given_up(self, call: _LoopCall) -> None:
        """On the loop, the future cancelled (a timeout): a call that has not begun never
        will, and its section ends now; one that began ends when its thread returns."""
        with self._lock:
            begun = call.started
        if not begun:
            call.done()

    def _run_for_loop(self, call: _LoopCall, fn: Callable[[], Any]) -> None:
        with self._lock:
            # The future's state is set before its callbacks run: a cancel seen here is one
            # _given_up has not judged yet, or judged "not begun".
            call.started = not call.future.cancelled()
        if not call.started:  # given up before it began: never run
            ok, outcome = False, None
        else:
            try:
                ok, outcome = True, fn()
            except BaseException as exc:  # handed to the awaiting step
                ok, outcome = False, exc
        with self._lock:
            self._back.append((call, ok, outcome))
            if self._back_due:
                return
            self._back_due = True
        try:
            call.loop.call_soon_threadsafe(self._hand_back)
        except RuntimeError:  # the loop has closed: nobody is left to tell
            with self._lock:
                self._back.clear()
                self._back_due = False

    def _hand_back(self) -> None:
        """On the loop: set every outcome that came back since the last hand-over."""
        with self._lock:
            back, self._back = self._back, []
            self._back_due = False
        for call, ok, outcome in back:
            call.done()
            if call.future.cancelled():
                continue
            if ok:
                call.future.set_result(outcome)
            elif outcome is not None:
                try:
                    call.future.set_exception(outcome)
                except TypeError:  # StopIteration cannot travel through a future
                    failure = RuntimeError(f"the step raised {type(outcome).__name__}")
                    failure.__cause__ = outcome
                    call.future.set_exception(failure)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._shutdown = True
            threads = list(self._threads)
        if cancel_futures:
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    _cancel(item[0])
                    with self._lock:
                        self._busy -= 1
                        if self._busy == 0:
                            self.all_idle.set()
        for _ in threads:
            self._queue.put(None)
        if wait:
            for thread in threads:
                thread.join()


def _cancel(target: Future[Any] | _LoopCall) -> None:
    """Cancel a call that never began (its section ends: ``done`` runs on its loop)."""
    if not isinstance(target, _LoopCall):
        target.cancel()
        return
    try:
        target.loop.call_soon_threadsafe(target.done)
        target.loop.call_soon_threadsafe(target.future.cancel)
    except RuntimeError:  # the loop has closed
        pass
