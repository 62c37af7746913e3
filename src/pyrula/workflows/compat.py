"""Replay compatibility: can this code replay that run's journal?

Before a run moves to new code, the new code must replay what the run's journal already
holds without a :class:`NonDeterminismError`: the same operations, by the same names, in
the same order, up to the run's frontier. :func:`replays_cleanly` answers that by running
the workflow function against the journal as an attempt's replay would, and nothing else:
the decisions (the name check, what a recorded step returns or raises, whether a timer
fired, which signal a wait takes) are :class:`~pyrula.workflows.replay.Replay`'s, the same
the engine follows. What the journal does not decide is the frontier: a step, sleep, wait
or value it holds no outcome for. The code stops there, as an attempt would park, and
nothing of it is executed: no step code runs, nothing is written, no store is needed.

Branches run together (``asyncio.gather``) each replay up to their own frontier before
the check ends, as an attempt runs every branch until all of them wait. Steps are never
run, so the check costs what replaying the journal costs: a few microseconds a call.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pyrula.workflows.children import GATHER_CHILDREN_OP, START_CHILD_OP, ChildHandle
from pyrula.workflows.context import WorkflowContext
from pyrula.workflows.definition import StepSpec, WorkflowSpec, current_engine
from pyrula.workflows.errors import ContinueAsNew, NonDeterminismError
from pyrula.workflows.events import INTERRUPT_SIGNAL, PATCH_OP, Event, EventType, dumps, loads
from pyrula.workflows.handlers import HandlerKind, Handlers, reapply_update
from pyrula.workflows.replay import Replay, WaitTurn

logger = logging.getLogger(__name__)

#: How long the code may await something that is not the journal's before the check
#: gives up (seconds): workflow code should await only steps, sleeps and waits.
DEFAULT_TIMEOUT = 5.0
#: Loop turns without progress, with every branch at the frontier, before the check ends
#: (the engine's attempt parks on the same test).
_QUIET_TURNS = 3


class Stop(StrEnum):
    """Where the code's replay ended."""

    #: It reached a call the journal does not decide (the run's next step, a sleep or
    #: wait still pending...): everything before it replayed.
    FRONTIER = "frontier"
    #: It returned (the journal may have ended the run, or the run ends on replay).
    RETURNED = "returned"
    #: It called ``continue_as_new``.
    CONTINUED = "continued"
    #: It raised (a recorded step failure, or an error of its own): not a divergence.
    RAISED = "raised"
    #: A call does not match the journal: the run would fail with NonDeterminismError.
    DIVERGED = "diverged"
    #: It awaited something that is not a step, sleep or wait for ``timeout`` seconds.
    STUCK = "stuck"


@dataclass(frozen=True, slots=True)
class Verdict:
    """Whether the code replays the journal cleanly, and where its replay ended."""

    ok: bool
    stop: Stop
    #: Why not (the NonDeterminismError's message), or what ended the replay.
    reason: str | None = None
    #: Calls the code made, the one at the frontier included.
    calls: int = 0

    def __bool__(self) -> bool:
        return self.ok


class _Frontier(BaseException):
    """Raised into the code at a call that must return a value now (``ctx.now()``...)
    that the journal does not hold: a BaseException, so the code's ``except Exception``
    does not take it for a failure of its own."""


class _Check:
    """The operations of the workflow code under check (the ``AttemptOperations`` and
    ``StepCaller`` of :class:`~pyrula.workflows.operations.Operations`, replay only)."""

    def __init__(self, replay: Replay, *, now: float, owner: str | None, token: int) -> None:
        self._replay = replay
        self._now = now
        self.run_id = replay.run_id
        self.name = replay.workflow
        self.owner = owner
        self.token = token
        self.start_id = replay.run_id
        self.divergence: NonDeterminismError | None = None
        self.frontier: str | None = None
        #: Calls the code made; operations taken or blocked (the check's progress).
        self.calls = 0
        self.moves = 0
        self.blocked = 0
        self.progress = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        #: The query and update handlers the code registered so far.
        self.handlers = Handlers()

    @property
    def is_replaying(self) -> bool:
        return self._replay.is_replaying

    def check_payload(self, value: Any, what: str) -> Any:
        return loads(dumps(value))

    def _refuse_if_over(self) -> None:
        if self.divergence is not None:
            raise asyncio.CancelledError  # the check is over: start nothing more

    def _take(self) -> int:
        self._refuse_if_over()
        self._moved()
        self.calls = self._replay.take_call()
        # The updates the run applied at this call apply again, as an attempt's replay does.
        for request, recorded in self._replay.recorded_updates(self.calls):
            reapply_update(self.handlers, request, recorded)
        return self.calls

    def op_set_handler(self, kind: HandlerKind, name: str, fn: Callable[..., Any] | None) -> None:
        self.handlers.set(kind, name, fn)

    def _moved(self) -> None:
        self.moves += 1
        self.progress.set()

    def _decide(self, decide: Callable[[], Any]) -> Any:
        try:
            return decide()
        except NonDeterminismError as exc:
            if self.divergence is None:
                self.divergence = exc
            self._moved()
            raise

    async def _reach(self, call: int, what: str) -> Any:
        """The journal does not decide ``call``: the code waits here for good."""
        if self.frontier is None:
            self.frontier = f"call {call}: {what}"
        self.blocked += 1
        self._moved()
        try:
            return await self._loop.create_future()  # never resolved: cancelled at the end
        finally:
            self.blocked -= 1

    # --- steps and values -----------------------------------------------------------

    def call_step(self, spec: StepSpec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return self._step(self._take(), spec.name)

    async def _step(self, call: int, name: str) -> Any:
        history = self._decide(lambda: self._replay.step(call, name))
        if history.completed:
            return history.result
        if history.failure is not None:
            raise history.failure
        return await self._reach(call, f"step {name!r}")

    def op_value(self, op: str, make: Callable[[Any], Any]) -> Any:
        call = self._take()
        history = self._decide(lambda: self._replay.value(call, op))
        if history.completed:
            return history.result
        if self.frontier is None:
            self.frontier = f"call {call}: {op}"
        raise _Frontier(op)

    def op_patched(self, patch_id: str) -> bool:
        self._refuse_if_over()
        applied, marker = self._replay.patch(patch_id, self._now)
        self._moved()
        self.calls = self._replay.calls_taken
        if marker is None:
            return applied
        # The journal does not decide this point: a run records the marker here.
        if self.frontier is None:
            self.frontier = f"call {self.calls}: {PATCH_OP} {patch_id!r}"
        raise _Frontier(PATCH_OP)

    def op_deprecate_patch(self, patch_id: str) -> None:
        self._refuse_if_over()
        self._replay.deprecated_patch(patch_id)
        self._moved()
        self.calls = self._replay.calls_taken

    # --- child workflows ----------------------------------------------------------------

    async def op_start_child(
        self, name: str, params: Any, *, idempotency_key: str | None, owner: str | None,
        on_parent_cancel: str,
    ) -> ChildHandle:
        call = self._take()
        for event in self._decide(lambda: self._replay.children(call, START_CHILD_OP)):
            return ChildHandle(self, str(event["child"]), name, float(event["ts"]))
        result: ChildHandle = await self._reach(call, f"{START_CHILD_OP} {name!r}")
        return result

    async def op_child_result(self, run_id: str, name: str, started_at: float) -> Any:
        # A child's result is in its own run, not in this journal: the check ends here.
        self._refuse_if_over()
        return await self._reach(self.calls, f"the result of child {run_id} ({name!r})")

    async def op_gather_children(
        self, children: list[tuple[str, Any]], max_concurrency: int | None,
        on_parent_cancel: str,
    ) -> list[Any]:
        call = self._take()
        self._decide(lambda: self._replay.children(call, GATHER_CHILDREN_OP))
        result: list[Any] = await self._reach(call, GATHER_CHILDREN_OP)
        return result

    # --- sleeps and waits -------------------------------------------------------------

    async def op_sleep(self, *, seconds: float | None, until: float | None) -> None:
        call = self._take()
        decision = self._decide(
            lambda: self._replay.sleep(call, now=self._now, seconds=seconds, until=until)
        )
        if decision.command is not None or decision.wake_at is not None:
            await self._reach(call, "pyrula.sleep")

    async def op_wait(self, signal: str, timeout: float | None) -> Any:
        return await self._wait(self._take(), "pyrula.wait_for_signal", signal, timeout, None)

    async def op_interrupt(self, payload: Any) -> Any:
        call = self._take()
        return await self._wait(call, "pyrula.interrupt", INTERRUPT_SIGNAL, None,
                                self.check_payload(payload, "interrupt payload"))

    async def _wait(
        self, call: int, op: str, signal: str, timeout: float | None, interrupt: Any
    ) -> Any:
        opened = self._decide(lambda: self._replay.open_wait(
            call, op, signal, now=self._now, timeout=timeout, interrupt=interrupt
        ))
        if opened.turn is WaitTurn.SIGNALLED:
            return opened.payload
        if opened.command is not None or opened.waiting is None:
            return await self._reach(call, op)
        turn = self._replay.resolve_wait(call, signal, opened.waiting, self._now)
        if turn.turn is WaitTurn.SIGNALLED:
            return turn.payload
        if turn.turn is WaitTurn.TIMED_OUT:
            return None
        return await self._reach(call, op)  # still waiting, or its timeout undecided


def _header(journal: Sequence[Event]) -> Event:
    if not journal or journal[0].get("type") != EventType.RUN_SUBMITTED:
        raise ValueError("a journal to check starts with its run:submitted (read it from seq 1)")
    return journal[0]


async def check_replay(
    spec: WorkflowSpec, journal: Sequence[Event], *, run_id: str = "?",
    timeout: float = DEFAULT_TIMEOUT,
) -> Verdict:
    """:func:`replays_cleanly` on the running event loop (the code runs in a task of its
    own, beside the loop's other work)."""
    verdict, _ = await replay_handlers(spec, journal, run_id=run_id, timeout=timeout)
    return verdict


async def replay_handlers(
    spec: WorkflowSpec, journal: Sequence[Event], *, run_id: str = "?",
    timeout: float = DEFAULT_TIMEOUT,
) -> tuple[Verdict, Handlers]:
    """:func:`check_replay`, and the query and update handlers the code had registered
    where its replay ended (what answers a query of the run)."""
    head = _header(journal)
    recorded = head.get("name")
    if recorded != spec.name:
        return Verdict(False, Stop.DIVERGED,
                       f"run {run_id} is a run of {recorded!r}, not of {spec.name!r}"), Handlers()
    replay = Replay(journal, workflow=spec.name, run_id=run_id)
    starts = sum(1 for e in journal if e.get("type") == EventType.RUN_STARTED)
    ops = _Check(replay, now=float(journal[-1].get("ts", 0.0)), owner=head.get("owner"),
                 token=max(1, starts))
    context = contextvars.copy_context()
    context.run(current_engine.set, ops)
    body = asyncio.get_running_loop().create_task(
        _body(spec, ops, head.get("params")), name=f"pyrula-replay-check:{run_id}",
        context=context,
    )
    try:
        stuck = not await _until_settled(body, ops, timeout)
    finally:
        if not body.done():
            body.cancel()
        # Awaited to its end, its exception taken: the verdict reports it, asyncio need not.
        await asyncio.gather(body, return_exceptions=True)
    return _verdict(body, ops, replay, stuck, timeout), ops.handlers


def _verdict(
    body: asyncio.Task[Any], ops: _Check, replay: Replay, stuck: bool, timeout: float
) -> Verdict:
    calls = ops.calls
    if ops.divergence is not None:
        return Verdict(False, Stop.DIVERGED, str(ops.divergence), calls)
    if stuck:
        return Verdict(False, Stop.STUCK,
                       f"the code awaited something other than a step, sleep or wait for "
                       f"{timeout:g} s (after call {calls})", calls)
    if not body.done() or body.cancelled():
        return Verdict(True, Stop.FRONTIER, ops.frontier, calls)
    error = body.exception()
    if isinstance(error, _Frontier):
        return Verdict(True, Stop.FRONTIER, ops.frontier, calls)
    if isinstance(error, ContinueAsNew):
        return Verdict(True, Stop.CONTINUED, None, calls)
    if error is not None:
        return Verdict(True, Stop.RAISED, f"{type(error).__name__}: {error}", calls)
    unreplayed = replay.unreplayed()
    if unreplayed is not None:
        return Verdict(False, Stop.DIVERGED, str(unreplayed), calls)
    return Verdict(True, Stop.RETURNED, None, calls)


async def _body(spec: WorkflowSpec, ops: _Check, params: Any) -> Any:
    return await spec.fn(WorkflowContext(ops), params)


async def _until_settled(body: asyncio.Task[Any], ops: _Check, timeout: float) -> bool:
    """Run the code until it ends, diverges, or waits at the frontier in every branch;
    False if it is still busy with something else after ``timeout``."""
    deadline = time.monotonic() + timeout
    quiet, last = 0, -1
    while not body.done() and ops.divergence is None:
        await asyncio.sleep(0)
        if ops.moves != last:
            quiet, last = 0, ops.moves
            continue
        if ops.blocked:
            quiet += 1
            if quiet >= _QUIET_TURNS:
                return True
            continue
        # Nothing moves and nothing waits at the frontier: the code awaits other things.
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        ops.progress.clear()
        moved = asyncio.ensure_future(ops.progress.wait())
        try:
            await asyncio.wait((body, moved), timeout=remaining,
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            moved.cancel()
    return True


def replays_cleanly(
    spec: WorkflowSpec, journal: Sequence[Event], *, run_id: str = "?",
    timeout: float = DEFAULT_TIMEOUT,
) -> Verdict:
    """Whether the code of ``spec`` replays the run's whole ``journal`` (from its
    ``run:submitted``) without a :class:`NonDeterminismError`, up to the run's frontier.

    Recorded step results are returned from the journal (recorded failures raised again),
    recorded sleeps and waits resolve as the journal decided them, and the code stops at
    the first call the journal does not decide: no step code runs, nothing is written.
    ``run_id`` only names the run in the reason. Runs the check on an event loop of its
    own (in a thread of its own if this thread runs one), so it may be called from
    anywhere; ``check_replay`` is the coroutine.
    """
    _header(journal)

    def check() -> Verdict:
        return asyncio.run(check_replay(spec, journal, run_id=run_id, timeout=timeout))

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return check()
    out: list[Verdict] = []
    failed: list[BaseException] = []

    def in_thread() -> None:
        try:
            out.append(check())
        except BaseException as exc:  # raised again in the caller's thread
            failed.append(exc)

    thread = threading.Thread(target=in_thread, name="pyrula-replay-check", daemon=True)
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    return out[0]
