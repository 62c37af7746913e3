"""The one way pyrula writes an instant for people and scripts to read.

Every JSON document a user reads (the CLI's ``--json`` outputs, ``RunRouter``'s answers,
the dashboard's routes, the ``time`` of a ``--log-format json`` line) writes an instant as
ISO-8601 UTC with a ``Z`` and milliseconds: ``2026-12-01T22:58:21.123Z``. Milliseconds,
always, so that every such string has one length and sorts as text; a finer clock than
that is not something an operator reads.

Stores and journals keep epoch seconds (a float): that is the data model, which replay
and the stores compare and do arithmetic on. Only what is rendered for a reader goes
through :func:`iso_utc`; :func:`readable_event` renders a journal event's instants.

Pure: the standard library only, so that every layer (engine, stores, supervisor, CLI)
may import it.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

#: The fields of a journal event that hold an instant (epoch seconds as stored).
EVENT_TIMES = ("ts", "wake_at", "retry_at", "timeout_at")


def iso_utc(ts: float) -> str:
    """Epoch seconds as ISO-8601 UTC with milliseconds and ``Z``:
    ``1796165901.1234`` → ``"2026-12-01T22:58:21.123Z"``."""
    moment = datetime.fromtimestamp(ts, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def iso_utc_or_none(ts: float | None) -> str | None:
    """:func:`iso_utc`, with None (an instant not reached yet) kept as None."""
    return None if ts is None else iso_utc(ts)


def iso_of_datetime(moment: datetime) -> str:
    """An aware datetime as :func:`iso_utc` writes it (a naive one is taken as UTC)."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return iso_utc(moment.timestamp())


def epoch_of(text: str) -> float:
    """The epoch seconds of an ISO-8601 string (with ``Z`` or an offset)."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def readable_event(event: dict[str, Any]) -> dict[str, Any]:
    """A copy of a journal event with its instants (``ts``, ``wake_at``, ``retry_at``,
    ``timeout_at``) as ISO-8601 UTC: the event as the CLI, ``RunRouter`` and the
    dashboard show it. The journal itself keeps epoch seconds."""
    shown = dict(event)
    for key in EVENT_TIMES:
        value = shown.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            shown[key] = iso_utc(float(value))
    return shown
