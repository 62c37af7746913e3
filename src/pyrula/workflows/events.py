"""Journal event types and their (de)serialisation.

An event is a plain ``dict`` with at least ``seq`` (1-based position in the run's journal,
assigned by the store), ``type`` (one of :class:`EventType`, stored as its ``str`` value)
and ``ts`` (epoch seconds). Engine-written events also carry ``call``: the index of the
workflow operation (step, sleep, wait, value) that wrote them, which replay matches on.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

import orjson

from pyrula.config.defaults import DEFAULT_MAX_PAYLOAD_BYTES as DEFAULT_MAX_PAYLOAD_BYTES

Event = dict[str, Any]


class EventType(StrEnum):
    RUN_SUBMITTED = "run:submitted"
    RUN_STARTED = "run:started"
    STEP_STARTED = "step:started"
    STEP_COMPLETED = "step:completed"
    STEP_FAILED = "step:failed"
    RUN_SLEEPING = "run:sleeping"
    RUN_WAITING = "run:waiting"
    SIGNAL_RECEIVED = "signal:received"
    INTERRUPT_RESUMED = "interrupt:resumed"
    RUN_WOKEN = "run:woken"
    RUN_REQUEUED = "run:requeued"
    RUN_COMPLETED = "run:completed"
    RUN_ERROR = "run:error"
    RUN_CANCELLED = "run:cancelled"
    RUN_CONTINUED = "run:continued"
    #: A fork's first attempt seeded it (``from_run``, ``from_step``, ``from_call``).
    RUN_FORKED = "run:forked"
    #: ``ctx.patched(patch_id)`` took the patched branch here (its marker: ``patch``, the id).
    PATCH_APPLIED = "patch:applied"
    #: ``ctx.start_child`` or ``ctx.gather_children`` started children here (their ids).
    CHILD_STARTED = "child:started"
    #: ``ctx.gather_children`` saw these of its children end (their indices): a marker,
    #: so a replay need not read them again until it reads the results.
    CHILD_ENDED = "child:ended"
    #: An update (``client.update``) was applied by its handler at call ``at_call``:
    #: ``update`` (its id), ``name``, and ``result`` or ``error_type`` and ``message``.
    UPDATE_APPLIED = "update:applied"


TERMINAL_EVENTS = frozenset(
    {EventType.RUN_COMPLETED, EventType.RUN_ERROR, EventType.RUN_CANCELLED, EventType.RUN_CONTINUED}
)

#: The signal name under which ``client.resume(run_id, value)`` is delivered to ``ctx.interrupt``.
INTERRUPT_SIGNAL = "pyrula.interrupt"
#: The signal name under which ``client.update(run_id, name, payload)`` is delivered: its
#: payload is ``{"id": update id, "name": name, "payload": payload}``.
UPDATE_SIGNAL = "pyrula.update"
#: The signal a run waits for when no live worker's code can replay its journal (an
#: upgrade changed its workflow incompatibly and the old code is gone).
BUILD_SIGNAL = "pyrula.build"
#: The signal a child's end sends its parent (payload ``{"child": run_id}``): a nudge to
#: look at its children again, never a result.
CHILD_SIGNAL = "pyrula.child"
#: The idempotency key of a child run starts with this, then its parent's run id.
CHILD_KEY_PREFIX = "pyrula.child:"
#: The operation name of a patch marker (``patch:applied``), which replay's name check reads.
PATCH_OP = "pyrula.patched"


def make_event(type_: EventType | str, ts: float, **fields: Any) -> Event:
    """Build an event without ``seq`` (the store assigns it on append)."""
    event: Event = {"type": str(type_), "ts": ts}
    event.update(fields)
    return event


def stamp_successor(events: list[Event], successor_id: str) -> None:
    """Write the id of the run that continues this one into its terminal event (the last
    of ``events``, a ``run:continued``): the one place the successor is recorded in a
    journal, by the store that queues the successor and by the engine's own copy."""
    if not events or events[-1].get("type") != EventType.RUN_CONTINUED:
        raise ValueError("the successor is stamped on a run:continued event only")
    events[-1]["successor"] = successor_id


def child_key(parent_id: str, suffix: str) -> str:
    """The idempotency key a parent submits child ``suffix`` with: a second submit (a
    replay, a crash between the submit and its journal record) finds the same child."""
    return f"{CHILD_KEY_PREFIX}{parent_id}:{suffix}"


def parent_of_key(idempotency_key: str | None) -> str | None:
    """The parent run id of a child run submitted with ``idempotency_key``, else None."""
    if not idempotency_key or not idempotency_key.startswith(CHILD_KEY_PREFIX):
        return None
    parent, sep, _ = idempotency_key[len(CHILD_KEY_PREFIX):].partition(":")
    return parent if sep and parent else None


#: Payloads (params, step results, signal payloads, resume values) are JSON and nothing
#: else: orjson's own encodings of datetimes and dataclasses are turned off, so such a
#: value is refused rather than stored as something it reads back differently.
_PAYLOAD_OPTIONS = (
    orjson.OPT_NON_STR_KEYS | orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS
)


def dumps(value: Any) -> bytes:
    """Serialise a JSON value; raises ``TypeError`` naming the offending type.

    ``NaN`` and the infinities are refused too: JSON has no such numbers (orjson would
    write them as ``null``, so the value would read back as None).
    """
    try:
        data = orjson.dumps(value, option=_PAYLOAD_OPTIONS)
    except TypeError as exc:  # orjson.JSONEncodeError is a TypeError
        raise TypeError(f"not JSON-serialisable: {_describe(value, exc)}") from None
    # A non-finite float is written as null, so only a payload with a null in it can hold
    # one: the walk below costs nothing for the others.
    if b"null" in data and _has_non_finite(value):
        raise TypeError("not JSON-serialisable: NaN or Infinity (JSON has no such numbers)")
    return data


def loads(data: bytes | str) -> Any:
    return orjson.loads(data)


def dumps_event(event: Event) -> bytes:
    return orjson.dumps(event, option=orjson.OPT_NON_STR_KEYS)


def loads_event(data: bytes | str) -> Event:
    event: Event = orjson.loads(data)
    return event


def _describe(value: Any, exc: Exception) -> str:
    bad = _first_unserialisable(value)
    if isinstance(bad, int) and not isinstance(bad, bool):
        return f"the integer {bad} is outside the 64-bit range JSON payloads may hold"
    if bad is not None:
        return f"type {type(bad).__module__}.{type(bad).__qualname__}"
    return str(exc)


def _has_non_finite(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float):
            if item != item or item in (_INF, -_INF):
                return True
        elif isinstance(item, dict):
            stack.extend(item.values())
            stack.extend(k for k in item if isinstance(k, float))
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return False


_INF = float("inf")


def _first_unserialisable(value: Any, depth: int = 0) -> Any:
    if depth > 64:
        return None
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str | int | float | bool) and k is not None:
                return k
            found = _first_unserialisable(v, depth + 1)
            if found is not None:
                return found
        return None
    if isinstance(value, list | tuple):
        for item in value:
            found = _first_unserialisable(item, depth + 1)
            if found is not None:
                return found
        return None
    try:
        orjson.dumps(value, option=_PAYLOAD_OPTIONS)
    except TypeError:
        return value
    return None
