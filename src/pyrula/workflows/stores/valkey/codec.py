"""How the Valkey store's values read and write: JSON fields, journal entries, run records
and the flat replies of hash and sorted-set commands (shared by every part of the store)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson

from pyrula.errors import JournalCorrupt
from pyrula.workflows.events import Event
from pyrula.workflows.records import RunInfo, RunOutcome, RunStatus, build_run_info
from pyrula.workflows.stores.common import journal_entry, started_event, submitted_event

logger = logging.getLogger(__name__)


def dumps(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()


def loads(data: Any) -> Any:
    if data is None or data == "":
        return None
    return orjson.loads(data)


def seconds(value: float) -> str:
    """A schedule time for a script: whole seconds print as integers (exact in Lua)."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def events(run_id: str, raw: Sequence[Any], first_seq: int,
           implied: Callable[[int], Event] | None = None) -> list[Event]:
    """Journal entries of ``run_id`` as events numbered from ``first_seq``. Empty entries
    are the placeholders of events the run record holds (run:submitted at seq 1, a first
    run:started at seq 2): ``implied(seq)`` builds them. Raises JournalCorrupt for an
    entry that is not an event."""
    out = []
    for offset, item in enumerate(raw):
        seq = first_seq + offset
        if item == "" and seq <= 2:
            if implied is None:
                raise AssertionError("a read of the journal's first events needs the record")
            try:
                event = implied(seq)
            except (KeyError, ValueError) as exc:  # a record forged or cut short
                raise JournalCorrupt(run_id, seq, f"(held by the run record) cannot be "
                                     f"built from it: {type(exc).__name__}: {exc}") from None
            event["seq"] = seq
        else:
            event = journal_entry(run_id, seq, item)
        out.append(event)
    return out


def submitted_from(name: str, params: Any, owner: str, created_at: str, idem: str,
                   predecessor: str) -> Event:
    """The run:submitted event of a run, built from what its record holds (the same event
    the submitting client described)."""
    event = submitted_event(float(created_at), name, params, owner or None, idem or None)
    if predecessor:
        event["predecessor"] = predecessor
    return event


def implied_of(fields: Mapping[str, str]) -> Callable[[int], Event]:
    """The events a run record implies: seq 1 run:submitted, seq 2 its first run:started."""

    def build(seq: int) -> Event:
        if seq == 1:
            return submitted_from(fields["name"], loads(fields.get("params")),
                                  fields.get("owner", ""), fields["created_at"],
                                  fields.get("idem", ""), fields.get("predecessor", ""))
        return started_event(float(fields["started_at"]), 1, fields["w1"],
                             fields.get("b1") or None, fields.get("idem") or None)

    return build


#: Each status by its stored word (a lookup, not an enum call: read for every run read).
_STATUSES = {status.value: status for status in RunStatus}


def run_info(run_id: str, f: Mapping[str, str]) -> RunInfo:
    """A run record (its hash's fields) as a RunInfo. Read for every run a client waits
    for, so it is built without a helper call per field."""
    get = f.get
    created = float(f["created_at"])
    started, finished, wake = get("started_at"), get("finished_at"), get("wake_at")
    waiting = get("waiting_for")
    return build_run_info(
        run_id,
        f["name"],
        _STATUSES.get(f["status"]) or RunStatus(f["status"]),
        int(get("attempt", 0)),
        loads(get("params")),
        get("owner") or None,
        created,
        float(get("updated_at") or created),
        float(started) if started else None,
        float(finished) if finished else None,
        loads(get("result")),
        loads(get("error")),
        float(wake) if wake else None,
        tuple(orjson.loads(waiting)) if waiting else (),
        loads(get("interrupt")),
        get("idem") or None,
        get("start_id") or run_id,
        get("successor_id") or None,
        int(get("prio") or 0),
    )


#: The fields of a run record that say how the run ended, in :class:`RunOutcome`'s order.
OUTCOME_FIELDS = ("status", "result", "error", "successor_id")


def run_outcome(values: Sequence[Any]) -> RunOutcome | None:
    """A run record's OUTCOME_FIELDS (an ``HMGET`` reply) as a RunOutcome; None where
    there is no record (every field missing)."""
    status, result, error, successor = values
    if status is None:
        return None
    return RunOutcome(_STATUSES.get(status) or RunStatus(status), loads(result), loads(error),
                      successor or None)


def parse_info(text: str) -> dict[str, str]:
    """``INFO`` text as a dict of its ``field:value`` lines."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and ":" in line:
            field, _, value = line.partition(":")
            out[field] = value.strip()
    return out


def as_hash(reply: Sequence[Any] | None) -> dict[str, str]:
    """A flat ``HGETALL`` reply as a dict."""
    if not reply:
        return {}
    it = iter(reply)
    return dict(zip(it, it, strict=True))


def as_scored(reply: Sequence[Any] | None) -> list[tuple[str, float]]:
    """A flat ``... WITHSCORES`` reply as (member, score) pairs."""
    if not reply:
        return []
    it = iter(reply)
    return [(str(member), float(score)) for member, score in zip(it, it, strict=True)]


def raise_first(replies: Sequence[Any]) -> None:
    """Raise the first error a pipeline or batch returned in place."""
    for reply in replies:
        if isinstance(reply, BaseException):
            raise reply
