"""WorkflowContext: what workflow code may ask of the engine.

Every method is journaled, so a replayed run sees the same values and waits resolve the
same way: ``now()``, ``uuid4()`` and ``random()`` return what the first execution
recorded; ``sleep``, ``wait_for_signal`` and ``interrupt`` park the run durably.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

from pyrula.workflows.errors import ContinueAsNew
from pyrula.workflows.events import UPDATE_SIGNAL
from pyrula.workflows.handlers import HandlerKind

if TYPE_CHECKING:
    from pyrula.workflows.children import ChildHandle
    from pyrula.workflows.clock import Clock

logger = logging.getLogger(__name__)


class AttemptOperations(Protocol):
    """What a :class:`WorkflowContext` asks of the attempt running the workflow's code
    (:class:`pyrula.workflows.operations.Operations`): who the run is, and its journaled
    operations."""

    @property
    def run_id(self) -> str: ...

    @property
    def name(self) -> str: ...

    @property
    def owner(self) -> str | None: ...

    @property
    def token(self) -> int: ...

    @property
    def start_id(self) -> str: ...

    @property
    def is_replaying(self) -> bool: ...

    async def op_sleep(self, *, seconds: float | None, until: float | None) -> None: ...

    async def op_wait(self, signal: str, timeout: float | None) -> Any: ...

    async def op_interrupt(self, payload: Any) -> Any: ...

    def op_value(self, op: str, make: Callable[[Clock], Any]) -> Any: ...

    def op_patched(self, patch_id: str) -> bool: ...

    def op_deprecate_patch(self, patch_id: str) -> None: ...

    def check_payload(self, value: Any, what: str) -> Any: ...

    async def op_start_child(
        self, name: str, params: Any, *, idempotency_key: str | None, owner: str | None,
        on_parent_cancel: str,
    ) -> ChildHandle: ...

    async def op_child_result(self, run_id: str, name: str, started_at: float) -> Any: ...

    async def op_gather_children(
        self, children: list[tuple[str, Any]], max_concurrency: int | None,
        on_parent_cancel: str,
    ) -> list[Any]: ...

    def op_set_handler(
        self, kind: HandlerKind, name: str, fn: Callable[..., Any] | None
    ) -> None: ...


def _patch_id(patch_id: Any) -> str:
    if not isinstance(patch_id, str) or not patch_id:
        raise ValueError(f"patch id must be a non-empty str, got {patch_id!r}")
    return patch_id


def _child_name(name: Any) -> str:
    """A child's workflow name, from a name or a ``@workflow`` function."""
    from pyrula.workflows.definition import workflow_name

    resolved = workflow_name(name)
    if not isinstance(resolved, str) or not resolved:
        raise ValueError(f"child workflow name must be a non-empty str, got {name!r}")
    return resolved


def _seconds(value: float | timedelta, what: str) -> float:
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{what} must be seconds (a number) or a timedelta, got {value!r}")
    return float(value)


class WorkflowContext:
    """Handed to every ``@workflow`` function as its first argument."""

    __slots__ = ("_attempt",)

    def __init__(self, attempt: AttemptOperations) -> None:
        self._attempt = attempt

    @property
    def run_id(self) -> str:
        return self._attempt.run_id

    @property
    def workflow_name(self) -> str:
        return self._attempt.name

    @property
    def owner(self) -> str | None:
        return self._attempt.owner

    @property
    def attempt(self) -> int:
        """The attempt number of this execution (1 for the first claim)."""
        return self._attempt.token

    @property
    def start_id(self) -> str:
        """The first run of this ``continue_as_new`` chain (this run's id if none)."""
        return self._attempt.start_id

    @property
    def is_replaying(self) -> bool:
        """True while the code is re-executing what the journal already holds."""
        return self._attempt.is_replaying

    async def sleep(self, duration: float | timedelta) -> None:
        """Park the run for ``duration``; its worker slot is freed meanwhile."""
        seconds = _seconds(duration, "sleep duration")
        if seconds < 0:
            raise ValueError(f"sleep duration must be >= 0, got {seconds}")
        await self._attempt.op_sleep(seconds=seconds, until=None)

    async def sleep_until(self, when: datetime) -> None:
        """Park the run until ``when`` (an aware datetime; a naive one is read as UTC)."""
        if not isinstance(when, datetime):
            raise TypeError(f"sleep_until needs a datetime, got {type(when).__name__}")
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        await self._attempt.op_sleep(seconds=None, until=when.timestamp())

    async def wait_for_signal(
        self, name: str, timeout: float | timedelta | None = None
    ) -> Any:
        """Wait for ``client.signal(run_id, name, payload)``; return its payload.

        Signals are buffered: one sent before the wait is consumed by it. With ``timeout``
        (seconds or timedelta) the wait returns None if no signal came in time.
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"signal name must be a non-empty str, got {name!r}")
        if name == UPDATE_SIGNAL:
            raise ValueError(f"signal name {name!r} is reserved for updates")
        seconds = None if timeout is None else _seconds(timeout, "timeout")
        if seconds is not None and seconds < 0:
            raise ValueError(f"timeout must be >= 0, got {seconds}")
        return await self._attempt.op_wait(name, seconds)

    async def interrupt(self, payload: Any = None) -> Any:
        """Park until ``client.resume(run_id, value)``; return ``value``.

        ``payload`` (JSON) tells whoever resumes what is asked; it shows in ``RunInfo``.
        """
        return await self._attempt.op_interrupt(payload)

    def set_query_handler(self, name: str, fn: Callable[..., Any] | None) -> None:
        """Answer ``client.query(run_id, name, *args)`` with ``fn(*args)``.

        ``fn`` is a plain function returning JSON; it reads the workflow's state and must
        not change it. The caller answers by replaying the run's journal with this code,
        so the handler registered where the journal ends answers. None removes it.
        """
        self._attempt.op_set_handler(HandlerKind.QUERY, name, fn)

    def set_update_handler(self, name: str, fn: Callable[[Any], Any] | None) -> None:
        """Apply ``client.update(run_id, name, payload)`` with ``fn(payload)``; the client
        gets what ``fn`` returns (JSON), or ``UpdateFailed`` with what it raised.

        An update is applied when the workflow next awaits a step, a sleep or a wait, or
        while it is parked; its outcome is journaled, so a replay applies each update once,
        at the same point. ``fn`` is a plain function. None removes it.
        """
        self._attempt.op_set_handler(HandlerKind.UPDATE, name, fn)

    def now(self) -> datetime:
        """The current time as an aware UTC datetime, recorded on first execution."""
        ts = self._attempt.op_value("pyrula.now", lambda clock: clock.now())
        return datetime.fromtimestamp(float(ts), UTC)

    def uuid4(self) -> uuid.UUID:
        """A random UUID, recorded on first execution."""
        return uuid.UUID(str(self._attempt.op_value("pyrula.uuid4", lambda _: str(uuid.uuid4()))))

    def random(self) -> float:
        """A random float in [0, 1), recorded on first execution."""
        import random as _random

        return float(self._attempt.op_value("pyrula.random", lambda _: _random.random()))

    def patched(self, patch_id: str) -> bool:
        """Whether this run takes the new branch of a code change named ``patch_id``.

        True for a run that reaches this point with the change deployed (a new run, or
        one recorded before that had not got this far): the answer is journaled, so its
        replays take the new branch too. False for a run whose journal was recorded
        past this point by the code before the change: it replays the old branch. The
        same answer for every call of the same id in a run.
        """
        return self._attempt.op_patched(_patch_id(patch_id))

    def deprecate_patch(self, patch_id: str) -> None:
        """Mark where ``ctx.patched(patch_id)`` was, once no run recorded before the
        change is open: the old branch can go. Records nothing; a run whose journal holds
        the patch's marker here still replays."""
        self._attempt.op_deprecate_patch(_patch_id(patch_id))

    async def start_child(
        self, name: Any, params: Any = None, *, idempotency_key: str | None = None,
        owner: str | None = None, on_parent_cancel: str = "cancel",
    ) -> ChildHandle:
        """Start workflow ``name`` (a name or a ``@workflow`` function) as a child run
        with ``params``; return its :class:`~pyrula.workflows.ChildHandle` at once.

        Journaled: a replay finds the same child, never starts a second. ``await handle``
        waits for its result without holding a worker slot. ``idempotency_key`` names the
        child within this run instead of the call's position; ``owner`` defaults to this
        run's. Cancelling this run cancels the child unless ``on_parent_cancel`` is
        ``"abandon"``.
        """
        from pyrula.workflows.children import check_on_parent_cancel

        policy = check_on_parent_cancel(on_parent_cancel)
        if idempotency_key is not None and (
            not isinstance(idempotency_key, str) or not idempotency_key
        ):
            raise ValueError(f"idempotency_key must be a non-empty str, got {idempotency_key!r}")
        return await self._attempt.op_start_child(
            _child_name(name), params, idempotency_key=idempotency_key, owner=owner,
            on_parent_cancel=policy,
        )

    async def child(self, name: Any, params: Any = None, **options: Any) -> Any:
        """Start a child run and wait for its result (``start_child`` then ``await``)."""
        handle = await self.start_child(name, params, **options)
        return await handle

    async def gather_children(
        self, children: Any, *, max_concurrency: int | None = None,
        on_parent_cancel: str = "cancel",
    ) -> list[Any]:
        """Run a child for each ``(name, params)`` of ``children``, at most
        ``max_concurrency`` at a time; return their results in order.

        Every child runs to its end; if any failed, the first failed one in order is
        raised as :class:`~pyrula.workflows.ChildFailed`. The journal records the
        children's ids, not their results: these are read from the children's runs.
        """
        from pyrula.workflows.children import check_on_parent_cancel

        policy = check_on_parent_cancel(on_parent_cancel)
        if max_concurrency is not None and (
            isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int)
            or max_concurrency < 1
        ):
            raise ValueError(f"max_concurrency must be an int >= 1, got {max_concurrency!r}")
        specs = [(_child_name(name), params) for name, params in children]
        if not specs:
            return []
        return await self._attempt.op_gather_children(specs, max_concurrency, policy)

    def continue_as_new(self, params: Any) -> NoReturn:
        """End this run now (status ``continued``) and queue a successor with ``params``.

        The successor keeps this run's name, owner and start id.
        """
        self._attempt.check_payload(params, "continue_as_new params")
        raise ContinueAsNew(params)
