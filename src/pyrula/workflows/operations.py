"""What a run's code asks of its attempt: the operations behind ``WorkflowContext`` and
``@step``.

Each operation takes the next call index and follows the replay algorithm: look the index
up (:class:`~pyrula.workflows.replay.Replay`: the name check, then what was recorded),
replay that, or do the operation for real and record it through the attempt's
write-behind buffer (:class:`~pyrula.workflows.writes.Writes`). An operation that must
wait for time or a signal blocks (:mod:`~pyrula.workflows.blockers`), and the attempt
loop parks the run on it. A step's own code runs on the injected executor (sync) or the
event loop (async), outside the workflow's context, in a user-code section reported to
the monitor.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import Executor
from typing import Any, Protocol

from pyrula.logs import RUN_FIELDS
from pyrula.workflows.blockers import BlockerKind, Blockers
from pyrula.workflows.children import (
    GATHER_CHILDREN_OP,
    START_CHILD_OP,
    ChildHandle,
    ChildOutcome,
    FanOut,
    child_started,
    children_ended,
    children_started,
    outcome_of,
)
from pyrula.workflows.clock import Clock
from pyrula.workflows.definition import (
    StepCaller,
    StepInfo,
    StepSpec,
    current_engine,
    current_step,
)
from pyrula.workflows.errors import NonDeterminismError, PayloadTooLarge, StepFailed
from pyrula.workflows.events import CHILD_SIGNAL, INTERRUPT_SIGNAL, child_key, dumps, loads
from pyrula.workflows.frames import failing_frame, user_traceback
from pyrula.workflows.handlers import HandlerKind, Handlers, apply_update, reapply_update
from pyrula.workflows.records import ClaimedRun
from pyrula.workflows.replay import (
    Replay,
    WaitTurn,
    retry_sleeping,
    step_completed,
    step_failed,
    step_started,
)
from pyrula.workflows.stop import Stop, StopState
from pyrula.workflows.writes import Writes

logger = logging.getLogger(__name__)

#: Tasks running a run's own code (its body, its async steps) are named with this prefix
#: and the run id, so a watchdog can tell whose code holds the event loop.
RUN_TASK_PREFIX = "pyrula-run:"
#: The run whose code runs in this context: set in the contexts of a run's body and of its
#: async steps. A task their code starts (a ``gather`` leg, an agent's tool call) copies
#: the context, and so names the run too; on Python 3.12 and later a watchdog reads it
#: through ``Task.get_context()``, where the task name would only name the engine's own.
RUNNING_RUN: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "pyrula_running_run", default=None
)



#: The ``run_async(loop, fn, done)`` of an executor that runs ``fn`` on a thread and sets
#: an asyncio future on ``loop`` with its outcome, calling ``done`` there first
#: (``pyrula.workflows.worker.pool.StepPool``).
RunAsync = Callable[[asyncio.AbstractEventLoop, Callable[[], Any], Callable[[], None]],
                    "asyncio.Future[Any]"]

class UserCodeMonitor(Protocol):
    """Told, on the event loop, when a run's own code starts and stops being in progress:
    its workflow body (except while the body itself waits on the store or on a durable
    sleep or wait) and each of its steps (a sync step until its thread returns). Sections
    nest and overlap (parallel steps); a run is in user code while any is open. ``enter``
    is called before the code can run, and the code runs only once it returned (a fleet
    child reports the run to its supervisor there first)."""

    def enter(self, run_id: str) -> None: ...

    def leave(self, run_id: str) -> None: ...


#: Told how long each try of a step ran (seconds) and whether it succeeded: the step's
#: name, its duration, ``True`` for a result (a worker's step-duration histogram).
StepObserver = Callable[[str, float, bool], None]


class Unmonitored:
    """The monitor of an attempt nobody watches."""

    def enter(self, run_id: str) -> None:
        pass

    def leave(self, run_id: str) -> None:
        pass


def _enter(engine: StepCaller | None, step: StepInfo | None, run_id: str,
           fields: dict[str, Any]) -> None:
    """Set, in the context this runs in, what the code run there reads: the engine its
    ``@step`` calls go to (None in a step's own code), the step it is, its run, and the
    fields its log lines carry."""
    current_engine.set(engine)
    if step is not None:
        current_step.set(step)
    RUNNING_RUN.set(run_id)
    RUN_FIELDS.set(fields)


def run_fields(claimed: ClaimedRun) -> dict[str, Any]:
    """The fields a log line written by the run's code carries (``pyrula.logs``)."""
    return {"run_id": claimed.run_id, "workflow": claimed.name, "attempt": claimed.token}


class StepTimeout(TimeoutError):
    """A step ran past its ``timeout=``."""


class Body:
    """The task running the workflow function of one attempt, and its user-code section."""

    def __init__(self, claimed: ClaimedRun, monitor: UserCodeMonitor) -> None:
        self._run_id = claimed.run_id
        self._fields = run_fields(claimed)
        self._monitor = monitor
        self._task: asyncio.Task[Any] | None = None
        self._on_done: Callable[[], None] | None = None

    def start(self, code: Awaitable[Any], engine: StepCaller,
              on_done: Callable[[], None]) -> asyncio.Task[Any]:
        """Run ``code`` (the workflow function's coroutine) in a task of its own, whose
        ``@step`` calls go to ``engine``; ``on_done()`` is called once it is done."""
        context = contextvars.copy_context()
        context.run(_enter, engine, None, self._run_id, self._fields)
        task = asyncio.get_running_loop().create_task(
            self._in_progress(code), name=RUN_TASK_PREFIX + self._run_id, context=context
        )
        # Forgotten once done: the task's context holds ``engine``, which holds ``waiting``
        # of this body, so keeping the task would make the attempt a reference cycle, left
        # for the cyclic collector instead of freed as it ends. One callback forgets it and
        # tells the attempt (each callback costs a turn of the loop).
        task.add_done_callback(self._ended)
        self._task, self._on_done = task, on_done
        return task

    def _ended(self, task: asyncio.Task[Any]) -> None:
        if self._task is task:
            self._task = None
        if self._on_done is not None:
            self._on_done()

    async def _in_progress(self, code: Awaitable[Any]) -> Any:
        # The body's code is in progress from its first line to its end (left before the
        # task is done, so the attempt never writes the run's end while it still counts).
        self._monitor.enter(self._run_id)
        try:
            return await code
        finally:
            self._monitor.leave(self._run_id)

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        """The workflow body waits here on the store or on a durable sleep or wait, not in
        its own code, and is not counted as in user code meanwhile. Only the body's own
        task counts so: a branch of an ``asyncio.gather`` (a task of its own) waiting here
        leaves the body, which awaits the gather, in progress."""
        body = self._task is not None and asyncio.current_task() is self._task
        if body:
            self._monitor.leave(self._run_id)
        try:
            yield
        finally:
            if body:  # before the body's code goes on (its finally blocks included)
                self._monitor.enter(self._run_id)


class Operations:
    """The operations of one attempt's workflow code; what ``WorkflowContext`` and the
    ``@step`` wrappers call."""

    def __init__(
        self,
        claimed: ClaimedRun,
        replay: Replay,
        writes: Writes,
        stops: StopState,
        clock: Clock,
        blockers: Blockers,
        *,
        executor: Executor | None,
        user_code: UserCodeMonitor,
        waiting: Callable[[], contextlib.AbstractContextManager[None]],
        on_step: StepObserver | None = None,
        max_payload_bytes: int,
        inline_retry_max: float,
        child_recheck: float = 60.0,
    ) -> None:
        self.run_id = claimed.run_id
        self.name = claimed.name
        self.owner = claimed.owner
        self.token = claimed.token
        self.start_id = claimed.start_id
        self._fields = run_fields(claimed)
        self._replay = replay
        self._writes = writes
        self._stops = stops
        self._clock = clock
        self._blockers = blockers
        self._executor = executor
        #: An executor that hands outcomes back to the loop itself, batched (the worker's
        #: sync-step pool), is used directly rather than through ``asyncio.wrap_future``.
        #: (Looked up, not ``isinstance`` of the protocol: that costs ~30 µs per attempt.)
        run_async = getattr(executor, "run_async", None)
        self._run_async: RunAsync | None = run_async if callable(run_async) else None
        self._user_code = user_code
        self._waiting = waiting
        self._on_step = on_step
        self._max_payload_bytes = max_payload_bytes
        self._inline_retry_max = inline_retry_max
        self._child_recheck = child_recheck
        #: Child waits block under negative keys (calls are positive), one per wait.
        self._child_waits = 0
        self.handlers = Handlers()

    @property
    def is_replaying(self) -> bool:
        return self._replay.is_replaying

    def check_payload(self, value: Any, what: str) -> Any:
        """Serialise ``value`` and return its JSON round trip; refuse what will not fit."""
        try:
            data = dumps(value)
        except TypeError as exc:
            raise TypeError(f"{what} is {exc}") from None
        limit = self._max_payload_bytes
        if len(data) > limit:
            raise PayloadTooLarge(
                f"{what} is {len(data)} bytes, above max_payload_bytes ({limit})"
            )
        return loads(data)

    # --- calls ------------------------------------------------------------------------

    def _refuse_if_ending(self) -> None:
        """Start nothing new once the attempt is ending or a cancel is known.

        The attempt loop ends an attempt (park, cancel, stand-down, failure) by cancelling
        the workflow task, which still runs its ``finally`` blocks: a step started there
        would execute unjournaled, on every park. A known cancel ends the attempt at the
        loop's next turn, which may come only after the code has started more.
        """
        if self._stops.refuses:
            raise asyncio.CancelledError

    def _take_call(self) -> int:
        self._refuse_if_ending()
        return self._replay.take_call()

    # --- query and update handlers ------------------------------------------------------

    def op_set_handler(self, kind: HandlerKind, name: str, fn: Callable[..., Any] | None) -> None:
        self.handlers.set(kind, name, fn)

    @property
    def accepts_updates(self) -> bool:
        """The code registered an update handler: a parked run is woken by an update."""
        return bool(self.handlers.updates)

    def apply_updates(self, call: int | None = None) -> None:
        """Apply the updates due at ``call`` (by default the last call taken, where every
        branch of the code is blocked): those the journal records there, again, for their
        effect on the workflow's state; then, past the journal, each update received and
        not applied yet, recording its outcome."""
        call = self._replay.calls_taken if call is None else call
        for request, recorded in self._replay.recorded_updates(call):
            reapply_update(self.handlers, request, recorded)
        if not self._replay.updates_open(call):
            return
        for request in self._replay.pending_updates():
            self._replay.take_update(request.id)
            self._writes.add(apply_update(
                self.handlers, request, now=self._clock.now(), at_call=call,
                check=self.check_payload,
            ))

    def _diverged(self, exc: NonDeterminismError) -> None:
        """Replay's name check failed: the divergence stops the attempt (the first one
        found is the one the run fails with) and is raised into the workflow code at its
        call too. (A try/except at each call rather than a context manager: this is on
        every step's path.)"""
        self._stops.ask(Stop.non_determinism(exc))

    # --- steps ------------------------------------------------------------------------

    def call_step(self, spec: StepSpec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        # The call index is taken here, synchronously, so steps started together
        # (asyncio.gather) are numbered in the order the code called them.
        call = self._take_call()
        self.apply_updates(call)
        return self._step(call, spec, args, kwargs)

    async def _step(
        self, call: int, spec: StepSpec, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        try:
            history = self._replay.step(call, spec.name)
        except NonDeterminismError as exc:
            self._diverged(exc)
            raise
        if history.completed:
            return history.result
        if history.failure is not None:
            raise history.failure
        failures, retry_at = history.failures, history.retry_at
        while True:
            if retry_at is not None:
                await self._retry_delay(call, spec, retry_at)
            await self._writes.settle()
            self._refuse_if_ending()  # a retry starts the step anew
            self._stops.raise_if_halted()  # nothing can be recorded: start no new step
            attempt = failures + 1
            self._writes.add(step_started(self._clock.now(), spec.name, call, attempt))
            began = time.perf_counter()
            try:
                info = StepInfo(self.run_id, self.name, spec.name, call, self.token, attempt)
                result = await self._execute(spec, info, args, kwargs)
            except Exception as exc:  # the step's own failure: record it, maybe retry
                retry_at = await self._step_failed(spec, call, attempt, exc, began)
                failures += 1
                continue
            try:
                result = self.check_payload(result, f"the result of step {spec.name!r}")
            except (TypeError, PayloadTooLarge) as exc:
                error_type = type(exc).__name__
                self._writes.add(step_failed(
                    self._clock.now(), spec.name, call, attempt, error_type, str(exc)
                ))
                await self._writes.boundary()
                raise StepFailed(spec.name, error_type, str(exc), attempt) from None
            if self._on_step is not None:
                self._on_step(spec.name, time.perf_counter() - began, True)
            self._writes.add(step_completed(self._clock.now(), spec.name, call, result))
            await self._writes.boundary()
            return result

    async def _step_failed(self, spec: StepSpec, call: int, attempt: int, exc: Exception,
                           began: float) -> float:
        """Record the failure of try ``attempt`` of the step at ``call``; the time its next
        try is due, or StepFailed when it has no retry left."""
        if self._on_step is not None:
            self._on_step(spec.name, time.perf_counter() - began, False)
        will_retry = attempt <= spec.retries
        error_type = type(exc).__name__
        message = str(exc) or error_type
        trace = user_traceback(exc)
        # Formatted: the traceback holds the frame that awaited the step, which holds the
        # step's future, which holds the exception, a reference cycle that would keep this
        # attempt's objects until the cyclic collector runs.
        exc.__traceback__ = None
        retry_at = None
        if will_retry:
            delay = spec.backoff(attempt) * random.uniform(1.0, 1.1)
            retry_at = self._clock.now() + delay
            self._log_retry(spec, attempt, delay, error_type, message, trace)
        failed = step_failed(self._clock.now(), spec.name, call, attempt, error_type, message,
                             retry_at=retry_at)
        failed["traceback"] = trace  # the step's own frames, for runs show
        self._writes.add(failed)
        await self._writes.boundary()
        if retry_at is None:
            raise StepFailed(spec.name, error_type, message, attempt, trace) from None
        return retry_at

    def _log_retry(self, spec: StepSpec, attempt: int, delay: float, error_type: str,
                   message: str, trace: str) -> None:
        """A step try that failed and is retried: a warning, so a flaky dependency shows
        in the log before it fails a run."""
        where = failing_frame(trace)
        logger.warning(
            "step_retry: step %s of run %s try %d of %d in %.1f s: %s: %s%s", spec.name,
            self.run_id, attempt + 1, spec.retries + 1, delay, error_type, message,
            f" (at {where})" if where else "",
            extra={"event": "step_retry", "run_id": self.run_id, "workflow": self.name,
                   "step": spec.name, "try": attempt + 1, "tries": spec.retries + 1},
        )

    async def _retry_delay(self, call: int, spec: StepSpec, retry_at: float) -> None:
        remaining = retry_at - self._clock.now()
        if remaining <= 0:
            return
        if remaining <= self._inline_retry_max:
            await self._writes.flush()
            with self._blockers.step_in_progress(), self._waiting():
                # A step in progress, so the attempt does not park under it.
                await self._clock.sleep(remaining)
            return
        if not self._replay.retry_recorded(call, retry_at):
            self._writes.add(retry_sleeping(self._clock.now(), spec.name, call, retry_at))
        await self._blockers.block(call, wake_at=retry_at, kind=BlockerKind.RETRY)

    async def _execute(
        self, spec: StepSpec, info: StepInfo, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        # Step code runs outside the workflow context: a step calling another @step
        # calls the plain function; step_info() tells it which step it is.
        context = contextvars.copy_context()
        context.run(_enter, None, info, self.run_id, {**self._fields, "step": spec.name})
        loop = asyncio.get_running_loop()
        with self._blockers.step_in_progress():
            future: asyncio.Future[Any]
            run_id, monitor = self.run_id, self._user_code
            monitor.enter(run_id)
            if spec.is_async:
                future = loop.create_task(
                    spec.fn(*args, **kwargs), name=RUN_TASK_PREFIX + self.run_id, context=context
                )
                future.add_done_callback(lambda _: monitor.leave(run_id))
            else:
                future = self._in_thread(loop, lambda: context.run(spec.fn, *args, **kwargs))
            if spec.timeout is None:  # no wait_for: a coroutine less on every step
                return await future
            try:
                return await asyncio.wait_for(future, spec.timeout)
            except TimeoutError:
                if spec.timeout is not None and future.cancelled():
                    raise StepTimeout(
                        f"step {spec.name!r} timed out after {spec.timeout:g} s"
                    ) from None
                raise

    def _in_thread(
        self, loop: asyncio.AbstractEventLoop, call: Callable[[], Any]
    ) -> asyncio.Future[Any]:
        """Run a sync step's ``call`` on the executor, its user-code section entered by the
        caller. The section ends when the thread returns (or the call is cancelled before
        it began), not when the step is given up: a timed-out step's thread runs on."""
        run_id, monitor = self.run_id, self._user_code
        if self._run_async is not None:
            try:
                return self._run_async(loop, call, lambda: monitor.leave(run_id))
            except BaseException:
                monitor.leave(run_id)
                raise
        if self._executor is None:  # the loop's default executor
            future = loop.run_in_executor(None, call)
            future.add_done_callback(lambda _: monitor.leave(run_id))
            return future
        try:
            done = self._executor.submit(call)
        except BaseException:
            monitor.leave(run_id)
            raise
        done.add_done_callback(lambda _: _call_soon(loop, monitor.leave, run_id))
        return asyncio.wrap_future(done, loop=loop)

    # --- sleeps, waits, values ----------------------------------------------------------

    async def op_sleep(self, *, seconds: float | None, until: float | None) -> None:
        call = self._take_call()
        self.apply_updates(call)
        try:
            decision = self._replay.sleep(
                call, now=self._clock.now(), seconds=seconds, until=until
            )
        except NonDeterminismError as exc:
            self._diverged(exc)
            raise
        if decision.command is not None:
            self._writes.add(decision.command)
        if decision.wake_at is not None:
            await self._blockers.block(call, wake_at=decision.wake_at)

    async def op_wait(self, signal: str, timeout: float | None) -> Any:
        call = self._take_call()
        self.apply_updates(call)
        return await self._wait(call, "pyrula.wait_for_signal", signal, timeout, None)

    async def op_interrupt(self, payload: Any) -> Any:
        call = self._take_call()
        self.apply_updates(call)
        payload = self.check_payload(payload, "interrupt payload")
        return await self._wait(call, "pyrula.interrupt", INTERRUPT_SIGNAL, None, payload)

    async def _wait(
        self, call: int, op: str, signal: str, timeout: float | None, interrupt: Any
    ) -> Any:
        try:
            opened = self._replay.open_wait(
                call, op, signal, now=self._clock.now(), timeout=timeout, interrupt=interrupt
            )
        except NonDeterminismError as exc:
            self._diverged(exc)
            raise
        if opened.turn is WaitTurn.SIGNALLED:
            return opened.payload
        assert opened.waiting is not None
        if opened.command is not None:
            self._writes.add(opened.command)
        while True:
            turn = self._replay.resolve_wait(call, signal, opened.waiting, self._clock.now())
            if turn.turn is WaitTurn.SIGNALLED:
                return turn.payload
            if turn.turn is WaitTurn.TIMED_OUT:
                return None
            if turn.turn is WaitTurn.DECIDE_TIMEOUT:
                assert turn.command is not None
                self._writes.add(turn.command)
                await self._writes.flush()
                continue
            await self._blockers.block(
                call, wake_at=turn.wake_at, signal=signal, interrupt=interrupt,
                kind=BlockerKind.WAIT,
            )

    def op_value(self, op: str, make: Callable[[Clock], Any]) -> Any:
        call = self._take_call()
        try:
            history = self._replay.value(call, op)
        except NonDeterminismError as exc:
            self._diverged(exc)
            raise
        if history.completed:
            return history.result
        value = make(self._clock)
        self._writes.add(step_completed(self._clock.now(), op, call, value))
        return value

    def op_patched(self, patch_id: str) -> bool:
        self._refuse_if_ending()
        applied, marker = self._replay.patch(patch_id, self._clock.now())
        if marker is not None:
            self._writes.add(marker)
        return applied

    def op_deprecate_patch(self, patch_id: str) -> None:
        self._refuse_if_ending()
        self._replay.deprecated_patch(patch_id)

    # --- child workflows ----------------------------------------------------------------

    async def op_start_child(
        self, name: str, params: Any, *, idempotency_key: str | None, owner: str | None,
        on_parent_cancel: str,
    ) -> ChildHandle:
        params = self.check_payload(params, f"the params of child workflow {name!r}")
        call = self._take_call()
        try:
            recorded = self._replay.children(call, START_CHILD_OP)
        except NonDeterminismError as exc:
            self._diverged(exc)
            raise
        for event in recorded:
            return ChildHandle(self, str(event["child"]), name, float(event["ts"]))
        self._stops.raise_if_halted()
        suffix = f"call:{call}" if idempotency_key is None else f"key:{idempotency_key}"
        child_id = await self._writes.submit_child(
            name, params, owner=self.owner if owner is None else owner,
            key=child_key(self.run_id, suffix),
        )
        now = self._clock.now()
        # Written at once: a cancel of this run cancels the children its journal names.
        self._writes.add(child_started(now, call, name, child_id, on_parent_cancel))
        await self._writes.flush()
        return ChildHandle(self, child_id, name, now)

    async def op_child_result(self, run_id: str, name: str, started_at: float) -> Any:
        """Wait for child ``run_id`` to end; its result (or its ChildFailed raised)."""
        self._refuse_if_ending()
        while True:
            seen = self._replay.child_signal_seq
            outcome = outcome_of(run_id, name, await self._writes.child_info(run_id))
            if outcome.ended:
                return outcome.value()
            await self._await_children(started_at, seen)

    async def _await_children(self, since: float, seen: int) -> None:
        """Block until a child's nudge comes in or the re-check timer is due. A nudge
        queues the parked run (its next attempt looks again) or, while this attempt runs,
        has the store refuse its park, which makes every child wait look again (a
        ``pyrula.child`` signal after ``seen``, the last one looked at, in a journal
        written before). The timer, whose period grows with the wait up to
        ``child_recheck``, finds a child whose nudge was lost (its worker died between
        the child's end and the nudge; the child was cancelled while parked)."""
        now = self._clock.now()
        period = min(self._child_recheck, max(1.0, (now - since) / 2))
        self._child_waits += 1
        await self._blockers.block(
            -self._child_waits, wake_at=now + period, signal=CHILD_SIGNAL,
            kind=BlockerKind.CHILD, since_seq=seen,
        )

    async def op_gather_children(
        self, children: list[tuple[str, Any]], max_concurrency: int | None,
        on_parent_cancel: str,
    ) -> list[Any]:
        checked = [
            (name, self.check_payload(params, f"the params of child workflow {name!r}"))
            for name, params in children
        ]
        call = self._take_call()
        try:
            fan = FanOut.from_journal(len(checked), self._replay.children(call, GATHER_CHILDREN_OP))
        except NonDeterminismError as exc:
            self._diverged(exc)
            raise
        limit = max_concurrency or max(1, len(checked))
        seen_info: dict[int, ChildOutcome] = {}
        while True:
            seen = self._replay.child_signal_seq
            await self._look_at_live(call, fan, checked, seen_info)
            await self._start_next(call, fan, checked, limit, on_parent_cancel)
            if fan.done:
                break
            await self._await_children(fan.began or self._clock.now(), seen)
        return await self._fan_results(fan, checked, seen_info)

    async def _look_at_live(self, call: int, fan: FanOut, children: list[tuple[str, Any]],
                            seen: dict[int, ChildOutcome]) -> None:
        live = fan.live()
        infos = await asyncio.gather(*(self._writes.child_info(fan.started[i]) for i in live))
        ended = []
        for index, info in zip(live, infos, strict=True):
            outcome = outcome_of(fan.started[index], children[index][0], info)
            if outcome.ended:
                seen[index] = outcome
                ended.append(index)
        if ended:
            fan.ended.update(ended)
            self._writes.add(children_ended(self._clock.now(), call, ended))

    async def _start_next(self, call: int, fan: FanOut, children: list[tuple[str, Any]],
                          limit: int, on_parent_cancel: str) -> None:
        indices = fan.to_start(limit)
        if not indices:
            return
        self._refuse_if_ending()
        self._stops.raise_if_halted()
        ids = await asyncio.gather(*(
            self._writes.submit_child(
                children[i][0], children[i][1], owner=self.owner,
                key=child_key(self.run_id, f"call:{call}.{i}"),
            ) for i in indices
        ))
        now = self._clock.now()
        started = [(i, run_id, children[i][0]) for i, run_id in zip(indices, ids, strict=True)]
        fan.started.update((i, run_id) for i, run_id, _ in started)
        fan.began = now if fan.began is None else fan.began
        self._writes.add(children_started(now, call, started, on_parent_cancel))
        await self._writes.flush()

    async def _fan_results(self, fan: FanOut, children: list[tuple[str, Any]],
                           seen: dict[int, ChildOutcome]) -> list[Any]:
        """The results in order (read from the children's runs); the first failure in
        order is raised once every child has ended."""
        missing = [i for i in range(fan.total) if i not in seen]
        for first in range(0, len(missing), 256):
            chunk = missing[first:first + 256]
            infos = await asyncio.gather(
                *(self._writes.child_info(fan.started[i]) for i in chunk)
            )
            for index, info in zip(chunk, infos, strict=True):
                seen[index] = outcome_of(fan.started[index], children[index][0], info)
        return [seen[i].value() for i in range(fan.total)]


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Callable[[str], None], arg: str) -> None:
    """``fn(arg)`` on ``loop`` from any thread; dropped if the loop has closed."""
    try:
        loop.call_soon_threadsafe(fn, arg)
    except RuntimeError:  # the loop is closed: nobody is left to tell
        pass
