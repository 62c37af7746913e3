"""One attempt of one run: replay the journal, run what is new, record it, end or park.

The workflow function is re-executed from the top on every attempt. Each operation it
performs (a step call, a sleep, a wait, a recorded value) takes the next *call index*;
replay looks the index up in the journal, checks the name recorded there against the
code (:class:`NonDeterminismError` on a mismatch), and either returns what was recorded
or runs the operation for real and records it. Steps are identified by call order and
name; waits resolve in journal order, so a signal and a timeout race the same way on
every replay.

The attempt is made of parts: :mod:`~pyrula.workflows.replay` (pure: what the journal
says of each operation), :mod:`~pyrula.workflows.operations` (what the code asks: steps,
sleeps, waits, values), :mod:`~pyrula.workflows.blockers` (what it waits on),
:mod:`~pyrula.workflows.writes` (the write-behind buffer and its fenced writes) and
:mod:`~pyrula.workflows.stop` (why the attempt stops, which reason wins). This module
drives them: the attempt loop runs the code until it returns, parks or is stopped, and
ends the attempt accordingly. What a worker reads of its attempts' code (the watchdog's
``RUN_TASK_PREFIX`` and ``RUNNING_RUN``, the ``UserCodeMonitor`` it passes) is defined
with the code in :mod:`~pyrula.workflows.operations` and offered here too.

The engine does no I/O of its own: every write goes through the fenced
:class:`~pyrula.workflows.stores.base.AttemptStore` calls of the store it is given.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pyrula.workflows.blockers import BlockerKind, Blockers
from pyrula.workflows.clock import SYSTEM_CLOCK, Clock
from pyrula.workflows.context import WorkflowContext
from pyrula.workflows.definition import WorkflowSpec
from pyrula.workflows.errors import (
    ChildFailed,
    ContinueAsNew,
    NonDeterminismError,
    PayloadTooLarge,
    StepFailed,
)
from pyrula.workflows.events import DEFAULT_MAX_PAYLOAD_BYTES, UPDATE_SIGNAL, Event
from pyrula.workflows.family import cancel_children, nudge_parent
from pyrula.workflows.frames import user_traceback
from pyrula.workflows.operations import RUN_TASK_PREFIX as RUN_TASK_PREFIX
from pyrula.workflows.operations import RUNNING_RUN as RUNNING_RUN
from pyrula.workflows.operations import Body, Operations, StepObserver, Unmonitored
from pyrula.workflows.operations import UserCodeMonitor as UserCodeMonitor
from pyrula.workflows.records import ClaimedRun, RunError, RunStatus
from pyrula.workflows.replay import (
    Replay,
    run_cancelled,
    run_completed,
    run_continued,
    woken_by_timeout,
)
from pyrula.workflows.stop import Halt, StandDown, Stop, StopReason, StopState
from pyrula.workflows.writes import EngineStore, Writes

logger = logging.getLogger(__name__)

@dataclass(frozen=True, slots=True)
class AttemptSettings:
    lock_ttl: float = 15.0
    step_boundary_durability: bool = True
    event_buffer_size: int = 64
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
    #: A retry delay longer than this parks the run on a durable timer instead of
    #: holding its slot while it waits.
    inline_retry_max: float = 5.0
    #: The longest a parent waiting for its children sleeps between two looks at their
    #: runs (a child's nudge wakes it sooner; the look finds a child whose nudge was lost).
    child_recheck: float = 60.0


class OutcomeKind(StrEnum):
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    CONTINUED = "continued"
    PARKED = "parked"
    REQUEUED = "requeued"
    LOST = "lost"  # the lock went to another attempt: nothing more may be written
    STORE_UNAVAILABLE = "store_unavailable"


#: How an attempt that halted ends.
_HALTED = {
    StopReason.LOST: OutcomeKind.LOST,
    StopReason.STORE_UNAVAILABLE: OutcomeKind.STORE_UNAVAILABLE,
}


@dataclass(slots=True)
class Outcome:
    kind: OutcomeKind
    journal: list[Event]
    #: A failed run's error (``RunError.as_dict()``, the ``RunInfo.error`` shape).
    error: dict[str, Any] | None = None
    successor_id: str | None = None
    #: A parked run's timer (None: it waits for a signal alone).
    wake_at: float | None = None
    #: Why a requeued run was put back (``shutdown``, ``loop_blocked``...).
    reason: str | None = None


class Attempt:
    """Drives one claimed attempt of a run to its next frontier.

    ``run()`` returns once the run has ended, parked, been requeued or lost its lock.
    ``request_cancel()`` and ``stand_down()`` may be called from the event loop while it
    runs (the worker calls them; they are not thread-safe); ``abandon()`` from any thread.
    """

    def __init__(
        self,
        spec: WorkflowSpec,
        claimed: ClaimedRun,
        journal: Sequence[Event],
        store: EngineStore,
        *,
        executor: Executor | None = None,
        clock: Clock = SYSTEM_CLOCK,
        settings: AttemptSettings | None = None,
        user_code: UserCodeMonitor | None = None,
        on_step: StepObserver | None = None,
    ) -> None:
        self.spec = spec
        self.run_id = claimed.run_id
        self.name = claimed.name
        self.token = claimed.token
        self.params = claimed.params
        self._store = store
        self._clock = clock
        settings = settings or AttemptSettings()
        self._user_code: UserCodeMonitor = user_code or Unmonitored()
        self._wake = asyncio.Event()
        self._body = Body(claimed, self._user_code)
        self._stops = StopState()
        self._replay = Replay(journal, workflow=claimed.name, run_id=claimed.run_id)
        self._writes = Writes(
            store, claimed.run_id, claimed.token, self._replay, self._stops, clock,
            lock_ttl=settings.lock_ttl, buffer_size=settings.event_buffer_size,
            boundary_durability=settings.step_boundary_durability, wake=self._wake,
            waiting=self._body.waiting,
        )
        self._blockers = Blockers(self._wake, self._body.waiting)
        self._ops = Operations(
            claimed, self._replay, self._writes, self._stops, clock, self._blockers,
            executor=executor, user_code=self._user_code, waiting=self._body.waiting,
            on_step=on_step, max_payload_bytes=settings.max_payload_bytes,
            inline_retry_max=settings.inline_retry_max,
            child_recheck=settings.child_recheck,
        )
        self._task: asyncio.Task[Any] | None = None  # the body's, once started
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def journal(self) -> list[Event]:
        return self._replay.journal

    # --- asked from outside ---------------------------------------------------------

    def request_cancel(self) -> None:
        """A client asked to cancel the run: end it as cancelled at the next turn."""
        self._writes.cancel_requested()

    def stand_down(self, reason: str, *, crash: bool = False, **detail: Any) -> None:
        """Stop this attempt and put the run back in the queue with ``reason``."""
        self._stops.ask(Stop.stand(reason, crash=crash, **detail))
        self._wake.set()

    def hand_back(self, reason: str, **detail: Any) -> None:
        """Put the run back in the queue with ``reason`` once the steps running now have
        finished and been recorded; start no new one (an upgrade moving the run to newer
        code)."""
        self._stops.ask(Stop.hand_back(reason, **detail))
        self._wake.set()

    def abandon(self) -> None:
        """The run's lock is gone (the worker's watchdog stood it down): write nothing more,
        start no new step, and end as LOST at the next turn. Safe from any thread."""
        self._stops.ask(Stop.lost())
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._wake.set)

    # --- the attempt loop -------------------------------------------------------------

    def _deadline(self) -> float | None:
        if self.spec.timeout is None:
            return None
        started = self._replay.started_at()
        first = started if started is not None else self._clock.now()
        return first + self.spec.timeout

    async def run(self, *, admission: Awaitable[Any] | None = None) -> Outcome:
        """Run the attempt to its next frontier.

        With ``admission``, the workflow's code starts only once it is done (a caller's
        gate); a cancel, a stand-down or a lost lock meanwhile ends the
        attempt without running any of the run's code.
        """
        self._loop = asyncio.get_running_loop()
        try:
            return await self._run(admission)
        except Halt:
            stop = self._stops.current
            assert stop is not None and stop.reason.halts
            await self._stop_task()
            return Outcome(_HALTED[stop.reason], self.journal)

    async def _admitted(self, admission: Awaitable[Any]) -> Outcome | None:
        """Wait for ``admission``; None once admitted, else how the attempt ended."""
        turn = asyncio.ensure_future(admission)
        try:
            while not turn.done():
                self._wake.clear()
                stop = self._stops.current
                if stop is not None:
                    return await self._stopped(stop)
                woken = asyncio.ensure_future(self._wake.wait())
                try:
                    await asyncio.wait((turn, woken), return_when=asyncio.FIRST_COMPLETED)
                finally:
                    woken.cancel()
            turn.result()
            return None
        finally:
            turn.cancel()

    async def _run(self, admission: Awaitable[Any] | None) -> Outcome:
        deadline = self._deadline()
        if deadline is not None and deadline <= self._clock.now():
            return await self._fail(self._timeout_error())
        if admission is not None:
            ended = await self._admitted(admission)
            if ended is not None:
                return ended
            if deadline is not None and deadline <= self._clock.now():  # it passed meanwhile
                return await self._fail(self._timeout_error())
        stop = self._stops.current
        if stop is not None:  # asked before the code began (a shutdown, a lost lock)
            return await self._stopped(stop)
        self._task = self._body.start(
            self.spec.fn(WorkflowContext(self._ops), self.params), self._ops, self._wake.set
        )
        while True:
            # Cleared before looking, not after: whatever happens while the checks below
            # await (the body ending, a step finishing) leaves the event set for the wait.
            self._wake.clear()
            stop = self._stops.current
            if stop is not None and not (stop.at_boundary and self._blockers.steps_running):
                return await self._stopped(stop)
            if self._task.done():
                return await self._conclude(self._task)
            if self._writes.boundary_due:
                # The body went on to something that is not a step (a sibling still runs,
                # or it awaits other code): the completion is written now.
                await self._writes.flush()
                continue
            if deadline is not None and self._clock.now() >= deadline:
                await self._stop_task()
                return await self._fail(self._timeout_error())
            if self._blockers.any and not self._blockers.steps_running and await self._quiescent():
                parked = await self._park(deadline)
                if parked is not None:
                    return parked
                continue
            if deadline is None:
                await self._wake.wait()
                continue
            try:
                await asyncio.wait_for(self._wake.wait(),
                                       max(0.0, deadline - self._clock.now()))
            except TimeoutError:
                pass

    async def _stopped(self, stop: Stop) -> Outcome:
        """End the attempt as its stop says, once its code is stopped."""
        await self._stop_task()
        reason = stop.reason
        if reason.halts:
            raise Halt(reason.value)
        if reason is StopReason.STAND_DOWN:
            assert stop.stand_down is not None
            return await self._requeue(stop.stand_down)
        if reason is StopReason.CANCEL:
            return await self._finish_cancelled()
        if reason is StopReason.NON_DETERMINISM:
            assert stop.error is not None
            return await self._fail(_non_determinism(stop.error))
        # ENDING is asked only as the loop itself ends the attempt; it looks no more then.
        raise AssertionError(f"attempt of run {self.run_id} stopped as {reason}")

    async def _quiescent(self) -> bool:
        """True once every branch of the workflow waits on a blocker (none is computing)."""
        assert self._task is not None
        for _ in range(3):
            await asyncio.sleep(0)
            if self._task.done() or self._blockers.steps_running or not self._blockers.any:
                return False
        return not self._blockers.any_resolved()

    async def _park(self, deadline: float | None) -> Outcome | None:
        # Every branch of the code is blocked: the updates received meanwhile apply now.
        self._ops.apply_updates()
        now = self._clock.now()
        due = self._blockers.due(now)
        if due:
            # A timer passed while other branches were busy: resolve it here, no park.
            for blocker in due:
                if blocker.kind is BlockerKind.WAIT:
                    self._writes.add(woken_by_timeout(self._clock.now(), blocker.call))
            await self._writes.flush()
            self._blockers.wake_due(due)
            return None
        if self._blockers.children_nudged(self._replay.child_signal_seq):
            # A child's nudge came in with other events after a child wait last looked (a
            # ``pyrula.child`` signal: a parent nudged through its journal, as before the
            # store's ``nudge``).
            self._blockers.rewake_waits()
            return None
        plan = self._blockers.plan(deadline)
        signals = [*plan.signals, UPDATE_SIGNAL] if self._ops.accepts_updates else plan.signals
        if await self._writes.park(
            now=now, wake_at=plan.wake_at, signals=signals, interrupt=plan.interrupt
        ):
            await self._stop_task()
            return Outcome(OutcomeKind.PARKED, self.journal, wake_at=plan.wake_at)
        # Not parked: a signal we wait for had already arrived, a child ended since the
        # child waits last looked (the store's nudge mark: no new event then), or a cancel
        # came. Every wait looks again (a child wait at its children's runs); the refused
        # park cleared the mark, so the next one parks unless another child has ended.
        self._blockers.rewake_waits()
        return None

    async def _stop_task(self) -> None:
        self._stops.ask(Stop.ending())
        task = self._task
        if task is None:
            return
        if task.done():
            if not task.cancelled():
                task.exception()  # the attempt reports the outcome; asyncio need not log it
            return
        task.cancel()
        try:
            await task
        except BaseException:  # the body's last gasp, including our cancellation
            pass

    # --- ending the attempt -----------------------------------------------------------

    async def _conclude(self, task: asyncio.Task[Any]) -> Outcome:
        if task.cancelled():
            return await self._finish_cancelled()
        # Looked at, not raised here: raised, the exception's traceback would hold this
        # frame, which holds the task, which holds the exception: a reference cycle that
        # keeps the attempt's objects until the cyclic collector runs.
        failure = task.exception()
        if failure is not None:
            return await self._raised(failure)
        result = task.result()
        unreplayed = self._replay.unreplayed()
        if unreplayed is not None:
            return await self._fail(_non_determinism(unreplayed))
        try:
            result = self._ops.check_payload(result, f"the result of workflow {self.name!r}")
        except (TypeError, PayloadTooLarge) as exc:
            return await self._fail(RunError("serialization", type(exc).__name__, str(exc)))
        self._writes.add(run_completed(self._clock.now(), result))
        await self._writes.finish(RunStatus.COMPLETED, result=result)
        await self._ended()
        return Outcome(OutcomeKind.COMPLETED, self.journal)

    async def _raised(self, exc: BaseException) -> Outcome:
        """End the run as the exception its body raised says."""
        if isinstance(exc, ContinueAsNew):
            return await self._continue(exc.params)
        if isinstance(exc, StepFailed):
            detail: dict[str, Any] = {"step": exc.step, "attempts": exc.attempts}
            if exc.traceback:
                detail["traceback"] = exc.traceback
            return await self._fail(RunError("step_failed", exc.error_type, str(exc), detail))
        if isinstance(exc, ChildFailed):
            return await self._fail(RunError("child_failed", "ChildFailed", str(exc), {
                "child": exc.run_id, "workflow": exc.name, "status": exc.status,
                "error_type": exc.error_type, "message": exc.message,
            }))
        if not isinstance(exc, Exception):  # KeyboardInterrupt, SystemExit: not the run's
            raise exc
        # The workflow body raised: the run fails with it.
        return await self._fail(RunError(
            "workflow_error", type(exc).__name__, str(exc) or type(exc).__name__,
            {"traceback": user_traceback(exc)},
        ))

    def _timeout_error(self) -> RunError:
        return RunError(
            "timeout", "TimeoutError",
            f"workflow {self.name!r} exceeded its timeout of {self.spec.timeout:g} s",
            {"timeout": self.spec.timeout},
        )

    async def _fail(self, error: RunError) -> Outcome:
        self._writes.add(error.event(self._clock.now()))
        stored = error.as_dict()
        await self._writes.finish(RunStatus.FAILED, error=stored)
        await self._ended()
        return Outcome(OutcomeKind.FAILED, self.journal, error=stored)

    async def _finish_cancelled(self) -> Outcome:
        self._writes.add(run_cancelled(self._clock.now()))
        await self._writes.finish(RunStatus.CANCELLED)
        await self._ended(cancelled=True)
        return Outcome(OutcomeKind.CANCELLED, self.journal)

    async def _continue(self, params: Any) -> Outcome:
        terminal = self._writes.add(run_continued(self._clock.now()))
        await self._writes.finish(RunStatus.CONTINUED, successor_params=params)
        return Outcome(OutcomeKind.CONTINUED, self.journal, successor_id=terminal.get("successor"))

    async def _ended(self, *, cancelled: bool = False) -> None:
        """The run's end is written: cancel its children if it was cancelled, and nudge
        its parent if it is a child (best effort, see ``family``)."""
        now = self._clock.now()
        try:
            if cancelled:
                await cancel_children(self._store, self.journal, now=now)
            await nudge_parent(self._store, self.run_id, self.journal, now=now)
        except Exception:  # the run has ended: its outcome stands whatever this does
            logger.warning("run %s ended; telling its parent or children failed",
                           self.run_id, exc_info=True)

    async def _requeue(self, stand: StandDown) -> Outcome:
        outcome = await self._writes.requeue(stand)
        if outcome.quarantined:
            await self._ended()
        return Outcome(
            OutcomeKind.FAILED if outcome.quarantined else OutcomeKind.REQUEUED, self.journal,
            reason=stand.reason,
        )


def _non_determinism(exc: NonDeterminismError) -> RunError:
    return RunError("non_determinism", "NonDeterminismError", str(exc))
