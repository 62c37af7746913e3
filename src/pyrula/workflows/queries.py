"""Answering queries and reading the replies to updates, for the clients.

A query is answered on the caller: the run's journal is replayed with the workflow's code
(:func:`~pyrula.workflows.compat.replay_handlers`: recorded steps return their results,
recorded updates apply again, nothing runs for real and nothing is written) up to where
the journal ends, and the query handler registered there is called. An update's reply is
the ``update:applied`` event the run's attempt records once it has applied it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyrula.workflows.compat import Stop, replay_handlers
from pyrula.workflows.definition import WorkflowSpec
from pyrula.workflows.errors import QueryFailed, UpdateFailed
from pyrula.workflows.events import TERMINAL_EVENTS, Event, EventType, dumps, loads
from pyrula.workflows.handlers import HandlerKind

#: How long a query's replay may wait on code that awaits something other than a step,
#: sleep or wait (seconds).
QUERY_REPLAY_TIMEOUT = 10.0


async def answer_query(
    spec: WorkflowSpec, journal: Sequence[Event], *, run_id: str, name: str,
    args: Sequence[Any], timeout: float = QUERY_REPLAY_TIMEOUT,
) -> Any:
    """Replay ``journal`` with ``spec``'s code and call query handler ``name`` with
    ``args``; its result as JSON. QueryFailed names what went wrong."""
    verdict, handlers = await replay_handlers(spec, journal, run_id=run_id, timeout=timeout)
    if verdict.stop in (Stop.DIVERGED, Stop.STUCK):
        raise QueryFailed(run_id, name, f"this process's code of workflow {spec.name!r} "
                          f"cannot replay the run: {verdict.reason}",
                          error_type="ReplayFailed")
    fn = handlers.queries.get(name)
    if fn is None:
        known = ", ".join(handlers.names(HandlerKind.QUERY)) or "none"
        raise QueryFailed(run_id, name, f"the run has no query handler named {name!r} "
                          f"(it has: {known})", error_type="NoQueryHandler")
    try:
        result = fn(*args)
    except Exception as exc:  # the handler's own error, handed to the caller
        raise QueryFailed(run_id, name, str(exc) or type(exc).__name__,
                          error_type=type(exc).__name__) from None
    try:
        return loads(dumps(result))
    except TypeError as exc:
        raise QueryFailed(run_id, name, f"the handler's result is {exc}",
                          error_type="TypeError") from None


@dataclass(frozen=True, slots=True)
class UpdateReply:
    """What the journal says of one update so far: ``done`` once applied (``result``, or
    the handler's ``error``), ``ended`` if the run ended before applying it."""

    done: bool = False
    result: Any = None
    error: tuple[str, str] | None = None
    ended: str | None = None


def update_reply(events: Sequence[Event], update_id: str) -> UpdateReply:
    """The reply to update ``update_id`` in ``events`` (a part of the run's journal)."""
    for event in events:
        type_ = event.get("type")
        if type_ == EventType.UPDATE_APPLIED and event.get("update") == update_id:
            if "error_type" in event:
                return UpdateReply(True, error=(str(event["error_type"]),
                                                str(event.get("message"))))
            return UpdateReply(True, result=event.get("result"))
        if type_ in TERMINAL_EVENTS:
            return UpdateReply(ended=str(type_).split(":", 1)[1])
    return UpdateReply()


def raise_for(reply: UpdateReply, run_id: str, name: str) -> Any:
    """The update's result, or UpdateFailed with its error (or the run's end)."""
    if reply.error is not None:
        raise UpdateFailed(run_id, name, *reply.error)
    if reply.ended is not None:
        raise UpdateFailed(run_id, name, "RunNotActive",
                           f"the run ended ({reply.ended}) before it applied the update")
    return reply.result
