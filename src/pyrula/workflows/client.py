"""WorkflowClient (async) and SyncWorkflowClient: submit runs and follow them.

``submit`` needs no registry, so the submitting tier need not import the workflows; a
run of a name no worker serves waits in its queue. Where the submitting process has the
workflow's definition and it has per-key limits, ``submit`` computes the run's keys
(``pyrula.workflows.limits``); elsewhere the worker computes them at the first claim.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from typing import Any, TypeVar

from pyrula.workflows._sync import run_sync
from pyrula.workflows.clock import SYSTEM_CLOCK, Clock
from pyrula.workflows.definition import REGISTRY, WorkflowSpec, workflow_name
from pyrula.workflows.errors import (
    ConfigurationError,
    PayloadTooLarge,
    ProjectionNotFound,
    QueryFailed,
    RunCancelled,
    RunFailed,
    RunNotActive,
    UpdateFailed,
    WorkflowNotFound,
)
from pyrula.workflows.events import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    INTERRUPT_SIGNAL,
    UPDATE_SIGNAL,
    Event,
    dumps,
)
from pyrula.workflows.forks import fork_point
from pyrula.workflows.priority import check_priority
from pyrula.workflows.projections import WHOLE, check_projection_name, is_internal
from pyrula.workflows.queries import UpdateReply, answer_query, raise_for, update_reply
from pyrula.workflows.readahead import ReadAhead
from pyrula.workflows.records import RunError, RunHandle, RunInfo, RunOutcome, RunStatus
from pyrula.workflows.stores.admin import run_for
from pyrula.workflows.stores.base import Store
from pyrula.workflows.stores.capabilities import (
    OutcomeReader,
    ProjectionHead,
    Projections,
    Triggers,
    capabilities_of,
)
from pyrula.workflows.triggers import check_topic

T = TypeVar("T")
#: A wait for a run's end: ``store.wait_result`` or an outcome reader's ``wait_outcome``.
_WaitEnded = Callable[[str, float | None], Awaitable[RunInfo | RunOutcome]]

#: How often ``update`` reads the run's journal for its reply: from the first to the last
#: pause (seconds), doubling.
_REPLY_POLL = (0.01, 0.25)


def _env_payload_limit() -> int:
    raw = os.environ.get("PYRULA_MAX_PAYLOAD_BYTES")
    if raw is None or raw == "":
        return DEFAULT_MAX_PAYLOAD_BYTES
    try:
        value = int(raw)
    except ValueError:
        raise ConfigurationError(
            f"PYRULA_MAX_PAYLOAD_BYTES must be an integer number of bytes, got {raw!r}"
        ) from None
    if value <= 0:
        raise ConfigurationError(f"PYRULA_MAX_PAYLOAD_BYTES must be > 0, got {raw!r}")
    return value


def _check_optional(what: str, value: Any) -> None:
    if value is not None and (not isinstance(value, str) or not value):
        raise ValueError(f"{what} must be a non-empty str or None, got {value!r}")


class _ReplyPoll:
    """Reading a run's journal for an update's reply, until a deadline."""

    def __init__(self, run_id: str, name: str, update_id: str, timeout: float | None,
                 clock: Clock) -> None:
        self.run_id, self.name, self.update_id = run_id, name, update_id
        self.after = 0
        self._timeout = timeout
        self._clock = clock
        self._deadline = None if timeout is None else clock.monotonic() + timeout
        self._pause = _REPLY_POLL[0]

    def look(self, events: list[Event]) -> UpdateReply | None:
        """The reply if ``events`` (those after ``after``) hold it or the run's end."""
        reply = update_reply(events, self.update_id)
        if reply.done or reply.ended is not None:
            return reply
        if events:
            self.after = int(events[-1]["seq"])
        return None

    def pause(self) -> float:
        """How long to wait before looking again; TimeoutError past the deadline."""
        pause, self._pause = self._pause, min(self._pause * 2, _REPLY_POLL[1])
        if self._deadline is None:
            return pause
        left = self._deadline - self._clock.monotonic()
        if left <= 0:
            raise TimeoutError(f"update {self.name!r} of run {self.run_id}: no reply within "
                               f"{self._timeout:g} s (it may still be applied)")
        return min(pause, left)


def _check_name(what: str, name: Any) -> None:
    if not isinstance(name, str) or not name:
        raise ValueError(f"{what} name must be a non-empty str, got {name!r}")


class WorkflowClient:
    """Submit, inspect, signal and cancel runs in ``store``."""

    def __init__(
        self,
        store: Store,
        *,
        clock: Clock = SYSTEM_CLOCK,
        max_payload_bytes: int | None = None,
    ) -> None:
        self.store = store
        self._clock = clock
        self._max_payload = max_payload_bytes or _env_payload_limit()
        #: Where the store reads runs' outcomes (``OutcomeReader``), if it can; ``result()``
        #: then waits with it rather than with ``wait_result``.
        self.outcomes: OutcomeReader | None = capabilities_of(store).outcomes
        self._wait_ended: _WaitEnded = (store.wait_result if self.outcomes is None
                                        else self.outcomes.wait_outcome)

    @property
    def max_payload_bytes(self) -> int:
        """The largest payload (params, signal payload, resume value) this client sends."""
        return self._max_payload

    def _payload(self, value: Any, what: str) -> None:
        try:
            data = dumps(value)
        except TypeError as exc:
            raise ValueError(f"{what} is {exc}") from None
        if len(data) > self._max_payload:
            raise PayloadTooLarge(
                f"{what} is {len(data)} bytes, above max_payload_bytes ({self._max_payload})"
            )

    async def submit(
        self,
        workflow: Any,
        params: Any = None,
        *,
        owner: str | None = None,
        idempotency_key: str | None = None,
        priority: int = 0,
    ) -> RunHandle:
        """Queue a run of ``workflow`` (a name or a ``@workflow`` function) with ``params``.

        A second submit with the same ``idempotency_key`` (for the same workflow name)
        returns the first run's handle. Raises ValueError for params that are not JSON.
        No params (or None) are ``{}``: a workflow reading ``params["x"]`` then fails with
        a KeyError naming the key, not with "NoneType is not subscriptable".
        ``priority`` (0..9, default 0): among its owner's queued runs, a run of a higher
        priority is claimed first (TypeError for a non-int, ValueError out of range).
        A workflow with a ``concurrency`` or ``rate`` limit whose definition this process
        has gets its keys computed here: a key function that fails raises
        LimitKeyFailed (a ValueError naming the workflow), writing nothing.
        """
        name = workflow_name(workflow)
        if params is None:
            params = {}
        _check_optional("owner", owner)
        _check_optional("idempotency_key", idempotency_key)
        priority = check_priority(priority)
        self._payload(params, f"params for workflow {name!r}")
        keyed = self._limit_keys(name, params)
        handle, _ = await self.store.submit(
            name, params, now=self._clock.now(), owner=owner, idempotency_key=idempotency_key,
            priority=priority, **keyed,
        )
        return handle

    def _limit_keys(self, name: str, params: Any) -> dict[str, Any]:
        """``{"limit_keys": ...}`` for a run of a limited workflow registered here, on a
        store that keeps keys; else nothing (the worker computes them, or refuses to serve
        a limited workflow on a store without limits)."""
        spec = REGISTRY.find(name)
        keys = spec.limit_keys(params) if spec is not None else None
        if keys is None or capabilities_of(self.store).limits is None:
            return {}
        return {"limit_keys": keys}

    async def fork(
        self, run_id: str, *, from_step: str | int, params: Any = None
    ) -> RunHandle:
        """Start a new run of ``run_id``'s workflow (same owner) that reuses what the run
        recorded before step ``from_step`` and runs the rest on today's code.

        ``from_step`` is a step name (the run's first call of it) or a 1-based position
        among the run's step calls. ``params`` replace the run's if given. The new run's
        journal names the run and step it forks (``run:forked``). Raises WorkflowNotFound
        for an unknown run, ValueError for a step the run never called.
        """
        info = await self.get(run_id)
        point = fork_point(run_id, await self.events(run_id), from_step)
        params = info.params if params is None else params
        self._payload(params, f"params for the fork of run {run_id}")
        handle, _ = await self.store.submit(
            info.name, params, now=self._clock.now(), owner=info.owner,
            idempotency_key=point.key(), priority=info.priority,
        )
        return handle

    async def emit(
        self, topic: str, payload: Any, *, key: str | None = None, owner: str | None = None
    ) -> str:
        """Record an event on ``topic``; return its id. Workflows declared with
        ``trigger=BatchTrigger(topic, ...)`` get it in the params of one of their runs.

        A second emit with the same ``key`` on the same topic is the same event: it returns
        the first one's id. Raises ValueError for an empty topic or a payload that is not
        JSON, PayloadTooLarge above ``max_payload_bytes``."""
        event_id, _ = await self.emit_event(topic, payload, key=key, owner=owner)
        return event_id

    async def emit_event(
        self, topic: str, payload: Any, *, key: str | None = None, owner: str | None = None
    ) -> tuple[str, bool]:
        """``emit``, telling also whether this call recorded the event (False: ``key``
        named one emitted before)."""
        topic = check_topic(topic)
        _check_optional("owner", owner)
        _check_optional("key", key)
        self._payload(payload, f"payload of the event on topic {topic!r}")
        return await self._triggers().emit(
            topic, payload, now=self._clock.now(), key=key, owner=owner
        )

    def _triggers(self) -> Triggers:
        triggers = capabilities_of(self.store).triggers
        if triggers is None:
            raise ConfigurationError(f"{self.store!r} keeps no events: emit needs a store "
                                     "with batch triggers (memory, SQLite, Valkey)")
        return triggers

    async def projection(self, name: str, key: str | int | None = None) -> Any:
        """The state of projection ``name`` as the workers last folded it: None before
        its first fold. For a keyed projection, the state of ``key`` (None if no run has
        that key yet), or without ``key`` every key's state as a dict. ValueError for a
        ``key`` given to a projection that is not keyed."""
        store = self._projections()
        head = await store.projection_head(check_projection_name(name))
        if head is None:
            return None
        if key is None:
            if head.keyed:
                return await store.projection_states(name, None)
            return (await store.projection_states(name, [WHOLE])).get(WHOLE)
        if not head.keyed:
            raise ValueError(f"projection {name!r} is not keyed: ask for it without key=")
        if isinstance(key, bool) or not isinstance(key, str | int):
            raise ValueError(f"a projection key is a str or an int, got {key!r}")
        return (await store.projection_states(name, [str(key)])).get(str(key))

    async def projection_info(self, name: str) -> ProjectionHead | None:
        """Projection ``name``'s version, checkpoint and runs folded; None before its
        first fold."""
        return await self._projections().projection_head(check_projection_name(name))

    async def projections(self) -> list[ProjectionHead]:
        """Every projection folded in this store (its version, checkpoint, runs folded),
        by name."""
        heads = await self._projections().projection_heads()
        return [head for head in heads if not is_internal(head.name)]

    async def rebuild_projection(self, name: str) -> None:
        """Drop projection ``name``'s state and checkpoint: the workers fold it again
        from the first run the store still keeps. ProjectionNotFound if it was never
        folded here."""
        done = await self._projections().reset_projection(check_projection_name(name),
                                                          now=self._clock.now())
        if not done:
            raise ProjectionNotFound(f"no projection named {name!r} in this store")

    def _projections(self) -> Projections:
        found = capabilities_of(self.store).projections
        if found is None:
            raise ConfigurationError(f"{self.store!r} keeps no projections (memory, SQLite "
                                     "and Valkey stores do)")
        return found

    async def served_names(self) -> list[str]:
        """Every workflow name a worker of this store has ever served, sorted (empty before
        the first worker): what a name about to be submitted can be checked against."""
        return await self.store.served_names()

    async def get(self, run_id: str) -> RunInfo:
        """The run's current state. Raises WorkflowNotFound for an unknown id."""
        info = await self.store.get_run(run_id)
        if info is None:
            raise WorkflowNotFound(f"no run with id {run_id!r}")
        return info

    async def result(self, run_id: str, timeout: float | None = None) -> Any:
        """Wait for the run to end and return its result.

        Follows a ``continue_as_new`` chain to its last run. Raises RunFailed (with the
        run's ``error`` dict), RunCancelled, or TimeoutError after ``timeout`` seconds.
        """
        wait = self._wait_ended
        loop_deadline = None if timeout is None else self._clock.monotonic() + timeout
        while True:
            remaining = None
            if loop_deadline is not None:
                remaining = max(0.0, loop_deadline - self._clock.monotonic())
            info = await wait(run_id, remaining)
            if info.status is RunStatus.CONTINUED and info.successor_id:
                run_id = info.successor_id
                continue
            return _value_of(run_id, info)

    async def events(self, run_id: str, after_seq: int = 0) -> list[Event]:
        """The run's journal, optionally only the events after ``after_seq``."""
        return await self.store.read_events(run_id, after_seq)

    async def signal(self, run_id: str, name: str, payload: Any = None) -> None:
        """Deliver a signal; a run waiting for it is queued. To a run that continued as
        new, it goes to the live run of its chain (the latest), which takes over the
        chain's inbox. Raises RunNotActive if that run has ended."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"signal name must be a non-empty str, got {name!r}")
        if name == INTERRUPT_SIGNAL:
            raise ValueError(f"{INTERRUPT_SIGNAL!r} is reserved; use client.resume()")
        if name == UPDATE_SIGNAL:
            raise ValueError(f"{UPDATE_SIGNAL!r} is reserved; use client.update()")
        self._payload(payload, f"payload of signal {name!r}")
        await self.store.signal(run_id, name, payload, now=self._clock.now())

    async def query(self, run_id: str, name: str, *args: Any) -> Any:
        """What the run's query handler ``name`` returns for ``args``.

        Answered here, by replaying the run's journal with the workflow's code (this
        process must have the workflow imported): nothing runs for real and nothing is
        written. Raises WorkflowNotFound for an unknown run, QueryFailed when the run has
        ended, its workflow is not registered here, it has no such handler, or the
        handler raised (``error_type`` and ``message`` are the handler's error).
        """
        _check_name("query", name)
        info, spec = await self._queried(run_id, name)
        journal = await self.store.read_events(info.run_id)
        return await answer_query(spec, journal, run_id=info.run_id, name=name, args=args)

    async def _queried(self, run_id: str, name: str) -> tuple[RunInfo, WorkflowSpec]:
        info = await self._live(run_id)
        if info.status.terminal:
            raise QueryFailed(run_id, name, f"the run has ended ({info.status.value}): only "
                              "a run that has not ended answers queries",
                              error_type="RunNotActive")
        try:
            spec = REGISTRY.workflow(info.name)
        except WorkflowNotFound:
            raise QueryFailed(run_id, name, f"workflow {info.name!r} is not registered in "
                              "this process: import the module that defines it to query "
                              "its runs", error_type="WorkflowNotFound") from None
        return info, spec

    async def _live(self, run_id: str) -> RunInfo:
        """The run, or the live run of its ``continue_as_new`` chain."""
        info = await self.get(run_id)
        while info.status is RunStatus.CONTINUED and info.successor_id:
            info = await self.get(info.successor_id)
        return info

    async def update(
        self, run_id: str, name: str, payload: Any = None, *, timeout: float | None = None
    ) -> Any:
        """Send update ``name`` with ``payload`` and return what the run's update handler
        returned, once the run has applied it (journaled: applied once).

        Raises UpdateFailed with the handler's error type and message if it raised, or if
        the run has no handler of that name, or ended before applying it; RunNotActive if
        the run has ended; TimeoutError after ``timeout`` seconds without a reply (the
        update stays in the run's inbox and may still be applied).
        """
        live, update_id = await self._send_update(run_id, name, payload)
        poll = _ReplyPoll(live, name, update_id, timeout, self._clock)
        while True:
            reply = poll.look(await self.store.read_events(live, poll.after))
            if reply is not None:
                return raise_for(reply, live, name)
            await asyncio.sleep(poll.pause())

    async def _send_update(self, run_id: str, name: str, payload: Any) -> tuple[str, str]:
        """Deliver the update to the live run; its id and the update's."""
        _check_name("update", name)
        self._payload(payload, f"payload of update {name!r}")
        info = await self._live(run_id)
        if info.status.terminal:
            raise RunNotActive(f"run {run_id} has already ended ({info.status.value})")
        if info.status in (RunStatus.SLEEPING, RunStatus.WAITING) and (
            UPDATE_SIGNAL not in info.waiting_for
        ):
            raise UpdateFailed(run_id, name, "NoUpdateHandler",
                               "the run is parked and has registered no update handler")
        update_id = uuid.uuid4().hex
        body = {"id": update_id, "name": name, "payload": payload}
        await self.store.signal(info.run_id, UPDATE_SIGNAL, body, now=self._clock.now())
        return info.run_id, update_id

    async def resume(self, run_id: str, value: Any = None) -> None:
        """Answer the run's ``ctx.interrupt``; it returns ``value``."""
        self._payload(value, "resume value")
        await self.store.signal(run_id, INTERRUPT_SIGNAL, value, now=self._clock.now())

    async def cancel(self, run_id: str) -> bool:
        """Cancel the run. Returns False if it had already ended.

        Its child workflows started with ``on_parent_cancel="cancel"`` are cancelled too
        (and theirs in turn) once the cancel is recorded. A child run ended here (it was
        parked or queued, so no attempt of its own ends it) nudges its parent.
        """
        from pyrula.workflows.family import cancel_children, nudge_parents_of

        cancelled = await self.store.cancel(run_id, now=self._clock.now())
        if cancelled:
            journal = await self.store.read_events(run_id)
            await cancel_children(self.store, journal, now=self._clock.now())
            await nudge_parents_of(self.store, [run_id], now=self._clock.now())
        return cancelled

    async def wake(self, run_id: str) -> bool:
        """Wake a sleeping run now instead of at its timer."""
        return await self.store.wake_run(run_id, now=self._clock.now())

    async def list_runs(
        self,
        *,
        name: Any = None,
        status: RunStatus | str | None = None,
        owner: str | None = None,
        limit: int | None = None,
        page_size: int = 100,
    ) -> AsyncIterator[RunInfo]:
        """Runs newest first, filtered by workflow name, status and owner."""
        wanted = None if name is None else workflow_name(name)
        state = None if status is None else RunStatus(status)
        if limit is not None and limit <= 0:
            return
        seen = 0
        before: tuple[float, str] | None = None
        while True:
            size = page_size if limit is None else min(page_size, limit - seen)
            page = await self.store.list_runs(
                name=wanted, status=state, owner=owner, limit=size, before=before
            )
            for info in page:
                yield info
                seen += 1
                if limit is not None and seen >= limit:
                    return
            if len(page) < size:
                return
            before = (page[-1].created_at, page[-1].run_id)


def _value_of(run_id: str, info: RunInfo | RunOutcome) -> Any:
    """What ``result()`` gives for an ended run that did not continue as new: its result,
    or RunFailed / RunCancelled raised."""
    if info.status is RunStatus.COMPLETED:
        return info.result
    if info.status is RunStatus.FAILED:
        raise RunFailed(run_id, info.error or {})
    if info.status is RunStatus.CANCELLED:
        raise RunCancelled(run_id)
    raise RunFailed(run_id, RunError("unknown", "", str(info)).as_dict())


class SyncWorkflowClient:
    """``WorkflowClient`` for code that is not async: each call blocks until done.

    Each call runs the async client's own code. On a store whose every call can finish
    without an event loop (``sync_driven``: the memory, SQLite and Valkey stores) it runs
    right on the calling thread; on the others (the archiving store, whose archive is
    asyncpg) it runs on a background event loop while the calling thread waits.
    """

    def __init__(self, store: Store, **kwargs: Any) -> None:
        self._client = WorkflowClient(store, **kwargs)
        self.store = store
        #: Where the store reads outcomes, the results this client waits for are read
        #: ahead in the order it submitted them (``readahead``).
        self._ahead = None if self._client.outcomes is None else ReadAhead()

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return run_for(self.store, coro)

    def submit(
        self,
        workflow: Any,
        params: Any = None,
        *,
        owner: str | None = None,
        idempotency_key: str | None = None,
        priority: int = 0,
    ) -> RunHandle:
        handle = self._run(self._client.submit(
            workflow, params, owner=owner, idempotency_key=idempotency_key, priority=priority
        ))
        if self._ahead is not None:
            self._ahead.submitted(handle.run_id)
        return handle

    def fork(self, run_id: str, *, from_step: str | int, params: Any = None) -> RunHandle:
        return self._run(self._client.fork(run_id, from_step=from_step, params=params))

    def emit(
        self, topic: str, payload: Any, *, key: str | None = None, owner: str | None = None
    ) -> str:
        return self._run(self._client.emit(topic, payload, key=key, owner=owner))

    def projection(self, name: str, key: str | int | None = None) -> Any:
        return self._run(self._client.projection(name, key))

    def projection_info(self, name: str) -> ProjectionHead | None:
        return self._run(self._client.projection_info(name))

    def projections(self) -> list[ProjectionHead]:
        return self._run(self._client.projections())

    def rebuild_projection(self, name: str) -> None:
        self._run(self._client.rebuild_projection(name))

    def served_names(self) -> list[str]:
        return self._run(self._client.served_names())

    def get(self, run_id: str) -> RunInfo:
        return self._run(self._client.get(run_id))

    def result(self, run_id: str, timeout: float | None = None) -> Any:
        """``WorkflowClient.result``. Results waited for in the order this client submitted
        the runs are read ahead (``pyrula.workflows.readahead``): the answers are the same,
        most without a round trip of their own."""
        ahead = self._ahead
        if ahead is not None:
            outcome = ahead.take(run_id)
            if outcome is None:
                outcome = self._look(ahead, run_id)
            if outcome is not None:
                if not (outcome.status is RunStatus.CONTINUED and outcome.successor_id):
                    return _value_of(run_id, outcome)
                run_id = outcome.successor_id  # its chain is followed the usual way
        return self._run(self._client.result(run_id, timeout))

    def _look(self, ahead: ReadAhead, run_id: str) -> RunOutcome | None:
        """``run_id``'s outcome if it has ended, read with the runs read ahead of it (when
        the read-ahead plans a read); None to wait for it the usual way."""
        plan = ahead.plan(run_id)
        outcomes = self._client.outcomes
        if plan is None or outcomes is None:
            return None
        read = self._run(outcomes.read_outcomes([run_id, *plan]))
        outcome = read[0]
        ended = outcome is not None and outcome.status.terminal
        ahead.read(ended, plan, read[1:])
        return outcome if ended else None

    def events(self, run_id: str, after_seq: int = 0) -> list[Event]:
        return self._run(self._client.events(run_id, after_seq))

    def signal(self, run_id: str, name: str, payload: Any = None) -> None:
        self._run(self._client.signal(run_id, name, payload))

    def resume(self, run_id: str, value: Any = None) -> None:
        self._run(self._client.resume(run_id, value))

    def query(self, run_id: str, name: str, *args: Any) -> Any:
        """``WorkflowClient.query``: the run is read here, its replay runs on an event loop
        in the background (the workflow's code is async)."""
        _check_name("query", name)
        info, spec = self._run(self._client._queried(run_id, name))
        journal = self._run(self.store.read_events(info.run_id))
        return run_sync(answer_query(spec, journal, run_id=info.run_id, name=name, args=args))

    def update(
        self, run_id: str, name: str, payload: Any = None, *, timeout: float | None = None
    ) -> Any:
        """``WorkflowClient.update``, waiting on this thread."""
        live, update_id = self._run(self._client._send_update(run_id, name, payload))
        poll = _ReplyPoll(live, name, update_id, timeout, self._client._clock)
        while True:
            reply = poll.look(self._run(self.store.read_events(live, poll.after)))
            if reply is not None:
                return raise_for(reply, live, name)
            time.sleep(poll.pause())

    def cancel(self, run_id: str) -> bool:
        return self._run(self._client.cancel(run_id))

    def wake(self, run_id: str) -> bool:
        return self._run(self._client.wake(run_id))

    def list_runs(
        self,
        *,
        name: Any = None,
        status: RunStatus | str | None = None,
        owner: str | None = None,
        limit: int | None = None,
    ) -> Iterator[RunInfo]:
        async def collect() -> list[RunInfo]:
            return [
                info
                async for info in self._client.list_runs(
                    name=name, status=status, owner=owner, limit=limit
                )
            ]

        return iter(self._run(collect()))
