"""One attempt of one run: replay the journal, run what is new, record it, end or park.

The workflow function is re-executed from the top on every attempt. Each operation it
performs (a step call, a sleep, a wait, a recorded value) takes the next *call index*;
replay looks the index up in the journal, checks the name recorded there against the
code (:class:`NonDeterminismError` on a mismatch), and either returns what was recorded
or runs the operation for real and records it. Steps are identified by call order and
name; waits resolve in journal order, so a signal and a timeout race the same way on
every replay.

The engine does no I/O of its own: every write goes through the fenced
:class:`~pyrula.workflows.stores.base.AttemptStore` calls of the store it is given.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import random
import traceback
from collections.abc import Awaitable, Callable, Iterator, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from pyrula.workflows.clock import SYSTEM_CLOCK, Clock
from pyrula.workflows.context import WorkflowContext
from pyrula.workflows.definition import (
    StepInfo,
    StepSpec,
    WorkflowSpec,
    current_engine,
    current_step,
)
from pyrula.workflows.errors import (
    ContinueAsNew,
    ControlFlow,
    NonDeterminismError,
    PayloadTooLarge,
    StaleToken,
    StepFailed,
    StoreUnavailable,
)
from pyrula.workflows.events import (
    INTERRUPT_SIGNAL,
    Event,
    EventType,
    dumps,
    loads,
    make_event,
)
from pyrula.workflows.records import ClaimedRun, RunStatus
from pyrula.workflows.stores.base import AttemptStore

logger = logging.getLogger(__name__)

DEFAULT_MAX_PAYLOAD_BYTES = 16 * 1024 * 1024

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


class EngineStore(AttemptStore, Protocol):
    async def read_events(self, run_id: str, after_seq: int = 0) -> list[Event]: ...


class UserCodeMonitor(Protocol):
    """Told, on the event loop, when a run's own code starts and stops being in progress:
    its workflow body (except while the body itself waits on the store or on a durable
    sleep or wait) and each of its steps (a sync step until its thread returns). Sections
    nest and overlap (parallel steps); a run is in user code while any is open. ``enter``
    is called before the code can run, and the code runs only once it returned (a fleet
    child reports the run to its supervisor there first)."""

    def enter(self, run_id: str) -> None: ...

    def leave(self, run_id: str) -> None: ...


class _Unmonitored:
    def enter(self, run_id: str) -> None:
        pass

    def leave(self, run_id: str) -> None:
        pass


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Callable[[str], None], arg: str) -> None:
    """``fn(arg)`` on ``loop`` from any thread; dropped if the loop has closed."""
    try:
        loop.call_soon_threadsafe(fn, arg)
    except RuntimeError:  # the loop is closed: nobody is left to tell
        pass


@dataclass(frozen=True, slots=True)
class AttemptSettings:
    lock_ttl: float = 15.0
    step_boundary_durability: bool = True
    event_buffer_size: int = 64
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
    #: A retry delay longer than this parks the run on a durable timer instead of
    #: holding its slot while it waits.
    inline_retry_max: float = 5.0


class OutcomeKind(StrEnum):
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    CONTINUED = "continued"
    PARKED = "parked"
    REQUEUED = "requeued"
    LOST = "lost"  # the lock went to another attempt: nothing more may be written
    STORE_UNAVAILABLE = "store_unavailable"


@dataclass(slots=True)
class Outcome:
    kind: OutcomeKind
    journal: list[Event]
    error: dict[str, Any] | None = None
    successor_id: str | None = None
    #: A parked run's timer (None: it waits for a signal alone).
    wake_at: float | None = None


@dataclass(slots=True)
class _Blocker:
    """An operation waiting for the run to be woken: a timer, a signal, or both."""

    call: int
    future: asyncio.Future[Any]
    wake_at: float | None = None
    signal: str | None = None
    interrupt: Any = None
    kind: str = "sleep"  # sleep | wait | retry


@dataclass(slots=True)
class _Stand:
    reason: str
    crash: bool = False
    detail: dict[str, Any] = field(default_factory=dict)


class _Halt(ControlFlow):
    """Internal: unwinds the attempt when a write was refused or the store is gone."""

    def __init__(self, kind: OutcomeKind) -> None:
        self.kind = kind
        super().__init__(kind.value)


class Attempt:
    """Drives one claimed attempt of a run to its next frontier.

    ``run()`` returns once the run has ended, parked, been requeued or lost its lock.
    ``request_cancel()`` and ``stand_down()`` may be called from the event loop while it
    runs (the worker calls them; they are not thread-safe).
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
    ) -> None:
        self.spec = spec
        self.run_id = claimed.run_id
        self.name = claimed.name
        self.owner = claimed.owner
        self.token = claimed.token
        self.start_id = claimed.start_id
        self.params = claimed.params
        self._store = store
        self._executor = executor
        self._clock = clock
        self._settings = settings or AttemptSettings()
        self._user_code: UserCodeMonitor = user_code or _Unmonitored()
        self.journal: list[Event] = []
        self._by_call: dict[int, list[Event]] = {}
        self._signals: list[Event] = []
        self._woken: list[Event] = []
        self._consumed: set[int] = set()
        self._index(journal)
        self._known_calls = max(self._by_call, default=0)
        self._next_call = 0
        self._pending: list[Event] = []
        # A step's completion is pending in the buffer and must be written before anything
        # else starts (see _boundary).
        self._boundary_due = False
        # One write of the attempt at a time: each takes the buffer, and events get their
        # seqs in the order written.
        self._writing = asyncio.Lock()
        self._blockers: dict[int, _Blocker] = {}
        self._steps_running = 0
        self._wake = asyncio.Event()
        self._cancel_requested = False
        self._ending = False
        self._stand: _Stand | None = None
        self._nondeterminism: NonDeterminismError | None = None
        self._task: asyncio.Task[Any] | None = None
        self._halted: OutcomeKind | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # --- the journal index ----------------------------------------------------------

    def _index(self, events: Sequence[Event]) -> None:
        for event in events:
            self.journal.append(event)
            call = event.get("call")
            if call is not None:
                self._by_call.setdefault(int(call), []).append(event)
            type_ = event["type"]
            if type_ in (EventType.SIGNAL_RECEIVED, EventType.INTERRUPT_RESUMED):
                self._signals.append(event)
            elif type_ == EventType.RUN_WOKEN:
                self._woken.append(event)

    @property
    def last_seq(self) -> int:
        return int(self.journal[-1]["seq"]) if self.journal else 0

    @property
    def is_replaying(self) -> bool:
        # Between operations ``_next_call`` counts those already taken, so the code is
        # replaying while the next one is still in the journal.
        return self._next_call < self._known_calls

    def _recorded(self, call: int, name: str) -> list[Event]:
        """Events recorded for ``call``, after checking they were written by ``name``."""
        events = self._by_call.get(call, [])
        for event in events:
            recorded = event.get("step") or event.get("op")
            if recorded is not None and recorded != name:
                self._fail_nondeterminism(
                    f"workflow {self.name!r} run {self.run_id}: the journal has {recorded!r} "
                    f"at call {call}, but the code now calls {name!r} there"
                )
        return events

    def _fail_nondeterminism(self, message: str) -> None:
        error = NonDeterminismError(message)
        if self._nondeterminism is None:
            self._nondeterminism = error
        raise error

    def _emit(self, type_: EventType, **fields: Any) -> Event:
        event = make_event(type_, self._clock.now(), **fields)
        self._pending.append(event)
        return event

    # --- store writes ---------------------------------------------------------------

    async def _write(self, call: Callable[[], Any]) -> Any:
        if self._halted is not None:
            raise _Halt(self._halted)
        try:
            return await call()
        except StaleToken:
            logger.warning(
                "run %s attempt %d lost its lock; standing down", self.run_id, self.token
            )
            self._halted = OutcomeKind.LOST
        except StoreUnavailable:
            self._halted = OutcomeKind.STORE_UNAVAILABLE
        raise _Halt(self._halted)

    async def _absorb(self, written: list[Event], last_seq: int) -> None:
        """Give the events just written their seqs; fetch any written by others between."""
        first = last_seq - len(written) + 1
        if first - 1 != self.last_seq:
            gap = await self._write(lambda: self._store.read_events(self.run_id, self.last_seq))
            self._index([e for e in gap if int(e["seq"]) < first])
        for offset, event in enumerate(written):
            event["seq"] = first + offset
        self._index(written)

    async def flush(self) -> None:
        if not self._pending and not self._writing.locked():
            self._boundary_due = False  # nothing to write nor to wait for
            return
        with self._waiting_on_engine():
            async with self._writing:
                self._boundary_due = False
                if not self._pending:
                    return
                batch, self._pending = self._pending, []
                result = await self._write(
                    lambda: self._store.append(
                        self.run_id,
                        self.token,
                        batch,
                        now=self._clock.now(),
                        lock_ttl=self._settings.lock_ttl,
                    )
                )
                await self._absorb(batch, result.last_seq)
        if result.cancel_requested:
            self.request_cancel()

    @contextlib.contextmanager
    def _waiting_on_engine(self) -> Iterator[None]:
        """The workflow body waits here on the store or on a durable sleep or wait, not in
        its own code, and is not counted as in user code meanwhile. Only the body's own
        task counts so: a branch of an ``asyncio.gather`` (a task of its own) waiting here
        leaves the body, which awaits the gather, in progress."""
        body = self._task is not None and asyncio.current_task() is self._task
        if body:
            self._user_code.leave(self.run_id)
        try:
            yield
        finally:
            if body:  # before the body's code goes on (its finally blocks included)
                self._user_code.enter(self.run_id)

    async def _boundary(self) -> None:
        """A step boundary: the step's events become durable before anything follows it.

        With ``step_boundary_durability`` they are written before the next step starts,
        with the run's park or end if one of those comes first, or at the attempt loop's
        next turn, whichever is first: so a run that returns right after its last step
        records the step and its end in one write, and a step's completion never waits
        behind a sibling still running. Otherwise they are written behind, when the buffer
        is full (or at the park or the end).
        """
        if len(self._pending) >= self._settings.event_buffer_size:
            await self.flush()
        elif self._settings.step_boundary_durability:
            self._boundary_due = True
            self._wake.set()

    async def _settle(self) -> None:
        """Before anything starts: the completions it follows are durable."""
        if self._boundary_due:
            await self.flush()

    # --- payloads -------------------------------------------------------------------

    def check_payload(self, value: Any, what: str) -> Any:
        """Serialise ``value`` and return its JSON round trip; refuse what will not fit."""
        try:
            data = dumps(value)
        except TypeError as exc:
            raise TypeError(f"{what} is {exc}") from None
        limit = self._settings.max_payload_bytes
        if len(data) > limit:
            raise PayloadTooLarge(
                f"{what} is {len(data)} bytes, above max_payload_bytes ({limit})"
            )
        return loads(data)

    # --- operations called by workflow code -----------------------------------------

    def _refuse_if_ending(self) -> None:
        """Start nothing new once the attempt is ending or a cancel is known.

        The attempt loop ends an attempt (park, cancel, stand-down, failure) by cancelling
        the workflow task, which still runs its ``finally`` blocks: a step started there
        would execute unjournaled, on every park. A known cancel ends the attempt at the
        loop's next turn, which may come only after the code has started more.
        """
        if self._ending or self._cancel_requested:
            raise asyncio.CancelledError

    def _take_call(self) -> int:
        self._refuse_if_ending()
        self._next_call += 1
        return self._next_call

    def call_step(self, spec: StepSpec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        # The call index is taken here, synchronously, so steps started together
        # (asyncio.gather) are numbered in the order the code called them.
        call = self._take_call()
        return self._step(call, spec, args, kwargs)

    async def _step(
        self, call: int, spec: StepSpec, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        recorded = self._recorded(call, spec.name)
        failures = 0
        retry_at: float | None = None
        for event in recorded:
            if event["type"] == EventType.STEP_COMPLETED:
                return event.get("result")
            if event["type"] == EventType.STEP_FAILED:
                if not event.get("will_retry"):
                    raise StepFailed(
                        spec.name, str(event.get("error_type")), str(event.get("message")),
                        int(event.get("attempt", failures + 1)),
                    )
                failures += 1
                retry_at = event.get("retry_at")
        while True:
            if retry_at is not None:
                await self._retry_delay(call, spec, retry_at)
            await self._settle()
            self._refuse_if_ending()  # a retry starts the step anew
            if self._halted is not None:  # nothing can be recorded: start no new step
                raise _Halt(self._halted)
            attempt = failures + 1
            self._emit(EventType.STEP_STARTED, step=spec.name, call=call, attempt=attempt)
            try:
                info = StepInfo(self.run_id, self.name, spec.name, call, self.token, attempt)
                result = await self._execute(spec, info, args, kwargs)
            except Exception as exc:  # the step's own failure: record it, maybe retry
                will_retry = failures < spec.retries
                error_type = type(exc).__name__
                message = _message(exc, spec)
                fields: dict[str, Any] = {}
                if will_retry:
                    delay = spec.backoff(failures + 1) * random.uniform(1.0, 1.1)
                    retry_at = self._clock.now() + delay
                    fields["retry_at"] = retry_at
                self._emit(
                    EventType.STEP_FAILED, step=spec.name, call=call, attempt=attempt,
                    error_type=error_type, message=message, will_retry=will_retry, **fields,
                )
                failures += 1
                await self._boundary()
                if not will_retry:
                    raise StepFailed(spec.name, error_type, message, attempt) from None
                continue
            try:
                result = self.check_payload(result, f"the result of step {spec.name!r}")
            except (TypeError, PayloadTooLarge) as exc:
                error_type = type(exc).__name__
                self._emit(
                    EventType.STEP_FAILED, step=spec.name, call=call, attempt=attempt,
                    error_type=error_type, message=str(exc), will_retry=False,
                )
                await self._boundary()
                raise StepFailed(spec.name, error_type, str(exc), attempt) from None
            self._emit(EventType.STEP_COMPLETED, step=spec.name, call=call, result=result)
            await self._boundary()
            return result

    async def _retry_delay(self, call: int, spec: StepSpec, retry_at: float) -> None:
        remaining = retry_at - self._clock.now()
        if remaining <= 0:
            return
        if remaining <= self._settings.inline_retry_max:
            await self.flush()
            with self._step_in_progress(), self._waiting_on_engine():
                # A step in progress, so the attempt does not park under it.
                await self._clock.sleep(remaining)
            return
        already = any(
            e["type"] == EventType.RUN_SLEEPING and e.get("wake_at") == retry_at
            for e in self._by_call.get(call, [])
        )
        if not already:
            self._emit(
                EventType.RUN_SLEEPING, step=spec.name, call=call,
                wake_at=retry_at, reason="retry",
            )
        await self._block(_Blocker(call, self._future(), wake_at=retry_at, kind="retry"))

    async def _execute(
        self, spec: StepSpec, info: StepInfo, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        # Step code runs outside the workflow context: a step calling another @step
        # calls the plain function; step_info() tells it which step it is.
        context = contextvars.copy_context()
        context.run(current_engine.set, None)
        context.run(current_step.set, info)
        context.run(RUNNING_RUN.set, self.run_id)
        loop = asyncio.get_running_loop()
        with self._step_in_progress():
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

    @contextlib.contextmanager
    def _step_in_progress(self) -> Iterator[None]:
        """Count a step as running (executing, or waiting out a short retry delay).

        The attempt parks only when no step is in progress; when the last one ends, the
        loop looks again.
        """
        self._steps_running += 1
        try:
            yield
        finally:
            self._steps_running -= 1
            if self._blockers:
                self._wake.set()

    def _future(self) -> asyncio.Future[Any]:
        return asyncio.get_running_loop().create_future()

    async def _block(self, blocker: _Blocker) -> Any:
        self._blockers[blocker.call] = blocker
        self._wake.set()
        try:
            with self._waiting_on_engine():
                return await blocker.future
        finally:
            self._blockers.pop(blocker.call, None)

    def _sleeping_event(self, call: int) -> Event | None:
        for event in self._by_call.get(call, []):
            if event["type"] == EventType.RUN_SLEEPING:
                return event
        return None

    def _timer_fired(self, since_seq: int, wake_at: float) -> Event | None:
        """The first ``run:woken`` after ``since_seq`` that fired at or past ``wake_at``."""
        for event in self._woken:
            if int(event["seq"]) <= since_seq:
                continue
            if event.get("reason") == "manual" or float(event["ts"]) >= wake_at:
                return event
        return None

    async def op_sleep(self, *, seconds: float | None, until: float | None) -> None:
        call = self._take_call()
        recorded = self._recorded(call, "pyrula.sleep")
        now = self._clock.now()
        if seconds is not None and seconds <= 0:
            return
        event = next((e for e in recorded if e["type"] == EventType.RUN_SLEEPING), None)
        if event is None:
            wake_at = until if until is not None else now + float(seconds or 0.0)
            if wake_at <= now:
                return
            self._emit(EventType.RUN_SLEEPING, op="pyrula.sleep", call=call, wake_at=wake_at)
            await self._block(_Blocker(call, self._future(), wake_at=wake_at))
            return
        wake_at = float(event["wake_at"])
        if "seq" in event and self._timer_fired(int(event["seq"]), wake_at) is not None:
            return
        if wake_at <= now:
            return
        await self._block(_Blocker(call, self._future(), wake_at=wake_at))

    def _first_unconsumed(self, signal: str) -> Event | None:
        for event in self._signals:
            if event.get("name") == signal and int(event["seq"]) not in self._consumed:
                return event
        return None

    async def op_wait(self, signal: str, timeout: float | None) -> Any:
        call = self._take_call()
        return await self._wait(call, "pyrula.wait_for_signal", signal, timeout, None)

    async def op_interrupt(self, payload: Any) -> Any:
        call = self._take_call()
        payload = self.check_payload(payload, "interrupt payload")
        return await self._wait(call, "pyrula.interrupt", INTERRUPT_SIGNAL, None, payload)

    async def _wait(
        self, call: int, op: str, signal: str, timeout: float | None, interrupt: Any
    ) -> Any:
        recorded = self._recorded(call, op)
        waiting = next((e for e in recorded if e["type"] == EventType.RUN_WAITING), None)
        if waiting is None:
            timeout_at = None if timeout is None else self._clock.now() + timeout
            candidate = self._first_unconsumed(signal)
            if candidate is not None:
                self._consumed.add(int(candidate["seq"]))
                return candidate.get("payload")
            # Even a zero timeout is recorded and decided durably below: on replay the
            # journal may hold a signal that arrived later, which this wait must not take.
            fields: dict[str, Any] = {"op": op, "call": call, "signal": signal}
            if timeout_at is not None:
                fields["timeout_at"] = timeout_at
            if signal == INTERRUPT_SIGNAL:
                fields["interrupt"] = interrupt
            waiting = self._emit(EventType.RUN_WAITING, **fields)
        return await self._resolve_wait(call, signal, waiting, interrupt)

    async def _resolve_wait(self, call: int, signal: str, waiting: Event, interrupt: Any) -> Any:
        while True:
            timeout_at = waiting.get("timeout_at")
            candidate = self._first_unconsumed(signal)
            fired = None
            if timeout_at is not None and "seq" in waiting:
                fired = self._timer_fired(int(waiting["seq"]), float(timeout_at))
            signal_first = fired is None or (
                candidate is not None and int(candidate["seq"]) < int(fired["seq"])
            )
            if candidate is not None and signal_first:
                self._consumed.add(int(candidate["seq"]))
                return candidate.get("payload")
            if fired is not None:
                return None
            if timeout_at is not None and float(timeout_at) <= self._clock.now():
                # Decide the timeout durably, so a signal arriving later cannot win on replay.
                self._emit(EventType.RUN_WOKEN, reason="timeout", call=call)
                await self.flush()
                continue
            blocker = _Blocker(
                call, self._future(),
                wake_at=None if timeout_at is None else float(timeout_at),
                signal=signal, interrupt=interrupt, kind="wait",
            )
            await self._block(blocker)

    def op_value(self, op: str, make: Callable[[Clock], Any]) -> Any:
        call = self._take_call()
        for event in self._recorded(call, op):
            if event["type"] == EventType.STEP_COMPLETED:
                return event.get("result")
        value = make(self._clock)
        self._emit(EventType.STEP_COMPLETED, step=op, call=call, result=value)
        return value

    # --- the attempt ----------------------------------------------------------------

    def request_cancel(self) -> None:
        """A client asked to cancel the run: end it as cancelled at the next turn."""
        self._cancel_requested = True
        self._wake.set()

    def stand_down(self, reason: str, *, crash: bool = False, **detail: Any) -> None:
        """Stop this attempt and put the run back in the queue with ``reason``."""
        if self._stand is None:
            self._stand = _Stand(reason, crash, dict(detail))
        self._wake.set()

    def abandon(self) -> None:
        """The run's lock is gone (the worker's watchdog stood it down): write nothing more,
        start no new step, and end as LOST at the next turn. Safe from any thread."""
        self._halted = OutcomeKind.LOST
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._wake.set)

    def _deadline(self) -> float | None:
        if self.spec.timeout is None:
            return None
        started = next(
            (e for e in self.journal if e["type"] == EventType.RUN_STARTED), None
        )
        first = float(started["ts"]) if started is not None else self._clock.now()
        return first + self.spec.timeout

    async def run(self, *, admission: Awaitable[Any] | None = None) -> Outcome:
        """Run the attempt to its next frontier.

        With ``admission``, the workflow's code starts only once it is done (the worker's
        gate for suspect runs); a cancel, a stand-down or a lost lock meanwhile ends the
        attempt without running any of the run's code.
        """
        self._loop = asyncio.get_running_loop()
        try:
            return await self._run(admission)
        except _Halt as halt:
            await self._stop_task()
            return Outcome(halt.kind, self.journal)

    async def _admitted(self, admission: Awaitable[Any]) -> Outcome | None:
        """Wait for ``admission``; None once admitted, else how the attempt ended."""
        turn = asyncio.ensure_future(admission)
        try:
            while not turn.done():
                self._wake.clear()
                if self._halted is not None:
                    raise _Halt(self._halted)
                if self._stand is not None:
                    return await self._requeue(self._stand)
                if self._cancel_requested:
                    return await self._finish_cancelled()
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
        context = contextvars.copy_context()
        context.run(current_engine.set, self)
        context.run(RUNNING_RUN.set, self.run_id)
        ctx = WorkflowContext(self)
        self._task = asyncio.get_running_loop().create_task(
            _body(self.spec.fn(ctx, self.params), self._user_code, self.run_id),
            name=RUN_TASK_PREFIX + self.run_id, context=context,
        )
        self._task.add_done_callback(lambda _: self._wake.set())
        while True:
            # Cleared before looking, not after: whatever happens while the checks below
            # await (the body ending, a step finishing) leaves the event set for the wait.
            self._wake.clear()
            if self._halted is not None:
                await self._stop_task()
                raise _Halt(self._halted)
            if self._stand is not None:
                await self._stop_task()
                return await self._requeue(self._stand)
            if self._cancel_requested:
                await self._stop_task()
                return await self._finish_cancelled()
            if self._nondeterminism is not None:
                await self._stop_task()
                return await self._fail(_nondeterminism_error(self._nondeterminism))
            if self._task.done():
                return await self._conclude(self._task)
            if self._boundary_due:
                # The body went on to something that is not a step (a sibling still runs,
                # or it awaits other code): the completion is written now.
                await self.flush()
                continue
            if deadline is not None and self._clock.now() >= deadline:
                await self._stop_task()
                return await self._fail(self._timeout_error())
            if self._blockers and self._steps_running == 0 and await self._quiescent():
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

    async def _quiescent(self) -> bool:
        """True once every branch of the workflow waits on a blocker (none is computing)."""
        assert self._task is not None
        for _ in range(3):
            await asyncio.sleep(0)
            if self._task.done() or self._steps_running or not self._blockers:
                return False
        return not any(b.future.done() for b in self._blockers.values())

    async def _park(self, deadline: float | None) -> Outcome | None:
        now = self._clock.now()
        due = [b for b in self._blockers.values() if b.wake_at is not None and b.wake_at <= now]
        if due:
            # A timer passed while other branches were busy: resolve it here, no park.
            for blocker in due:
                if blocker.kind == "wait":
                    self._emit(EventType.RUN_WOKEN, reason="timeout", call=blocker.call)
            await self.flush()
            for blocker in due:
                if blocker.kind != "wait" and not blocker.future.done():
                    blocker.future.set_result(None)
            self._rewake_waits()
            return None
        wakes = [b.wake_at for b in self._blockers.values() if b.wake_at is not None]
        if deadline is not None:
            wakes.append(deadline)
        signals = sorted({b.signal for b in self._blockers.values() if b.signal is not None})
        interrupt = next(
            (b.interrupt for b in self._blockers.values() if b.signal == INTERRUPT_SIGNAL), None
        )
        async with self._writing:
            self._boundary_due = False
            batch, self._pending = self._pending, []
            known = self.last_seq
            result = await self._write(
                lambda: self._store.park(
                    self.run_id, self.token, batch, now=now,
                    wake_at=min(wakes) if wakes else None, signals=signals,
                    known_seq=known, interrupt=interrupt,
                )
            )
            if result.parked:
                await self._absorb(batch, result.last_seq)
        if result.parked:
            await self._stop_task()
            return Outcome(OutcomeKind.PARKED, self.journal, wake_at=min(wakes) if wakes else None)
        # Not parked: a signal we wait for had already arrived, or a cancel came.
        first = result.last_seq - len(batch) + 1
        for offset, event in enumerate(batch):
            event["seq"] = first + offset
        others = [e for e in result.events if int(e["seq"]) < first]
        self._index(sorted(others + batch, key=lambda e: int(e["seq"])))
        if result.cancel_requested:
            self.request_cancel()
        self._rewake_waits()
        return None

    def _rewake_waits(self) -> None:
        """Let every waiting branch re-check the journal (a signal or timeout may be in)."""
        for blocker in list(self._blockers.values()):
            if blocker.kind == "wait" and not blocker.future.done():
                blocker.future.set_result(None)

    async def _stop_task(self) -> None:
        self._ending = True
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

    async def _conclude(self, task: asyncio.Task[Any]) -> Outcome:
        if self._nondeterminism is not None:
            return await self._fail(_nondeterminism_error(self._nondeterminism))
        try:
            result = task.result()
        except asyncio.CancelledError:
            return await self._finish_cancelled()
        except ContinueAsNew as cont:
            return await self._continue(cont.params)
        except StepFailed as exc:
            return await self._fail({
                "code": "step_failed",
                "error_type": exc.error_type,
                "message": str(exc),
                "detail": {"step": exc.step, "attempts": exc.attempts},
            })
        except Exception as exc:  # the workflow body raised: the run fails with it
            return await self._fail({
                "code": "workflow_error",
                "error_type": type(exc).__name__,
                "message": str(exc) or type(exc).__name__,
                "detail": {"traceback": _traceback(exc)},
            })
        unreplayed = [c for c in self._by_call if c > self._next_call and self._by_call[c]]
        if unreplayed:
            return await self._fail(_nondeterminism_error(NonDeterminismError(
                f"workflow {self.name!r} run {self.run_id}: the code returned after "
                f"{self._next_call} calls, but the journal records call {min(unreplayed)}"
            )))
        try:
            result = self.check_payload(result, f"the result of workflow {self.name!r}")
        except (TypeError, PayloadTooLarge) as exc:
            return await self._fail({
                "code": "serialization", "error_type": type(exc).__name__,
                "message": str(exc), "detail": None,
            })
        self._emit(EventType.RUN_COMPLETED, result=result)
        await self._finish(RunStatus.COMPLETED, result=result)
        return Outcome(OutcomeKind.COMPLETED, self.journal)

    def _timeout_error(self) -> dict[str, Any]:
        return {
            "code": "timeout",
            "error_type": "TimeoutError",
            "message": f"workflow {self.name!r} exceeded its timeout of {self.spec.timeout:g} s",
            "detail": {"timeout": self.spec.timeout},
        }

    async def _fail(self, error: dict[str, Any]) -> Outcome:
        self._emit(
            EventType.RUN_ERROR, code=error["code"], error_type=error["error_type"],
            message=error["message"], detail=error.get("detail"),
        )
        await self._finish(RunStatus.FAILED, error=error)
        return Outcome(OutcomeKind.FAILED, self.journal, error=error)

    async def _finish_cancelled(self) -> Outcome:
        self._emit(EventType.RUN_CANCELLED)
        await self._finish(RunStatus.CANCELLED)
        return Outcome(OutcomeKind.CANCELLED, self.journal)

    async def _continue(self, params: Any) -> Outcome:
        terminal = self._emit(EventType.RUN_CONTINUED)
        await self._finish(RunStatus.CONTINUED, successor_params=params)
        return Outcome(OutcomeKind.CONTINUED, self.journal, successor_id=terminal.get("successor"))

    async def _finish(
        self,
        status: RunStatus,
        *,
        result: Any = None,
        error: dict[str, Any] | None = None,
        successor_params: Any = None,
    ) -> None:
        async with self._writing:
            self._boundary_due = False
            batch, self._pending = self._pending, []
            finished = await self._write(
                lambda: self._store.finish(
                    self.run_id, self.token, batch, now=self._clock.now(), status=status,
                    result=result, error=error, successor_params=successor_params,
                )
            )
            if finished.successor_id is not None:
                batch[-1]["successor"] = finished.successor_id
            await self._absorb(batch, finished.last_seq)

    async def _requeue(self, stand: _Stand) -> Outcome:
        async with self._writing:
            self._boundary_due = False
            batch, self._pending = self._pending, []
            outcome = await self._write(
                lambda: self._store.requeue(
                    self.run_id, self.token, now=self._clock.now(), reason=stand.reason,
                    events=batch, crash=stand.crash, crash_detail=stand.detail or None,
                )
            )
        return Outcome(
            OutcomeKind.FAILED if outcome.quarantined else OutcomeKind.REQUEUED, self.journal
        )


async def _body(awaitable: Awaitable[Any], monitor: UserCodeMonitor, run_id: str) -> Any:
    # The body's code is in progress from its first line to its end (left before the task
    # is done, so the attempt never writes the run's end while it still counts).
    monitor.enter(run_id)
    try:
        return await awaitable
    finally:
        monitor.leave(run_id)


class StepTimeout(TimeoutError):
    """A step ran past its ``timeout=``."""


def _message(exc: BaseException, spec: StepSpec) -> str:
    return str(exc) or type(exc).__name__


def _traceback(exc: BaseException) -> str:
    text = "".join(traceback.format_exception(exc))
    return text[-4000:]


def _nondeterminism_error(exc: NonDeterminismError) -> dict[str, Any]:
    return {
        "code": "non_determinism",
        "error_type": "NonDeterminismError",
        "message": str(exc),
        "detail": None,
    }
