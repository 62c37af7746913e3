"""Query and update handlers a workflow registers, and what applying an update records.

Pure: no asyncio, no store, no clock (the caller passes ``now``). A workflow registers its
handlers through ``ctx.set_query_handler`` and ``ctx.set_update_handler``; an update
reaches the run as a ``pyrula.update`` signal (:class:`UpdateRequest`), and the attempt
applies it with :func:`apply_update`, whose ``update:applied`` event is the reply the
client reads back. A replay re-applies each recorded update with :func:`reapply_update`
at the same point of the code, so the workflow's state is rebuilt the same way.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pyrula.workflows.errors import PayloadTooLarge
from pyrula.workflows.events import Event, EventType, make_event

#: Turns a handler's result into its JSON round trip, or raises TypeError/PayloadTooLarge.
Check = Callable[[Any, str], Any]

#: The error type recorded for an update whose name has no handler in the run.
NO_UPDATE_HANDLER = "NoUpdateHandler"


class HandlerKind(StrEnum):
    QUERY = "query"
    UPDATE = "update"


@dataclass(frozen=True, slots=True)
class UpdateRequest:
    """One ``client.update`` as its signal carries it."""

    id: str
    name: str
    payload: Any
    seq: int

    @classmethod
    def of(cls, signal: Event) -> UpdateRequest | None:
        """The request a ``pyrula.update`` signal carries; None if it is malformed."""
        body = signal.get("payload")
        if not isinstance(body, dict):
            return None
        update_id, name = body.get("id"), body.get("name")
        if not isinstance(update_id, str) or not isinstance(name, str):
            return None
        return cls(update_id, name, body.get("payload"), int(signal.get("seq", 0)))


class Handlers:
    """The query and update handlers one execution of a workflow's code registered."""

    __slots__ = ("queries", "updates")

    def __init__(self) -> None:
        self.queries: dict[str, Callable[..., Any]] = {}
        self.updates: dict[str, Callable[[Any], Any]] = {}

    def set(self, kind: HandlerKind, name: str, fn: Callable[..., Any] | None) -> None:
        """Register ``fn`` under ``name`` (replacing any); ``fn`` None removes it."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"{kind} name must be a non-empty str, got {name!r}")
        table: dict[str, Callable[..., Any]] = (
            self.queries if kind is HandlerKind.QUERY else self.updates
        )
        if fn is None:
            table.pop(name, None)
            return
        if not callable(fn):
            raise TypeError(f"{kind} handler {name!r} must be callable, got {fn!r}")
        if inspect.iscoroutinefunction(fn):
            raise TypeError(f"{kind} handler {name!r} must be a plain function, not async")
        table[name] = fn

    def names(self, kind: HandlerKind) -> list[str]:
        return sorted(self.queries if kind is HandlerKind.QUERY else self.updates)


def apply_update(
    handlers: Handlers, request: UpdateRequest, *, now: float, at_call: int, check: Check
) -> Event:
    """Run the handler of ``request`` and return the ``update:applied`` event recording
    its outcome (its result, or the error it raised)."""
    fn = handlers.updates.get(request.name)
    if fn is None:
        known = ", ".join(handlers.names(HandlerKind.UPDATE)) or "none"
        return update_applied(
            now, request, at_call, error=(
                NO_UPDATE_HANDLER,
                f"the run has no update handler named {request.name!r} (it has: {known})",
            ),
        )
    try:
        result = fn(request.payload)
    except Exception as exc:  # the handler refused the update: the client gets its error
        return update_applied(now, request, at_call, error=(type(exc).__name__,
                                                            str(exc) or type(exc).__name__))
    try:
        result = check(result, f"the result of update {request.name!r}")
    except (TypeError, PayloadTooLarge) as exc:
        return update_applied(now, request, at_call, error=(type(exc).__name__, str(exc)))
    return update_applied(now, request, at_call, result=result)


def reapply_update(handlers: Handlers, request: UpdateRequest, recorded: Event) -> None:
    """Replay an applied update: run its handler again for its effect on the workflow's
    state; what it returns or raises now is dropped (the journal's outcome stands)."""
    if recorded.get("error_type") == NO_UPDATE_HANDLER:
        return
    fn = handlers.updates.get(request.name)
    if fn is None:
        return
    try:
        fn(request.payload)
    except Exception:  # recorded as the update's failure the first time
        pass


def update_applied(
    now: float, request: UpdateRequest, at_call: int, *, result: Any = None,
    error: tuple[str, str] | None = None,
) -> Event:
    fields: dict[str, Any] = {"update": request.id, "name": request.name, "at_call": at_call}
    if error is None:
        fields["result"] = result
    else:
        fields["error_type"], fields["message"] = error
    return make_event(EventType.UPDATE_APPLIED, now, **fields)
