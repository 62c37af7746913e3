"""Pure helpers every store backend shares: ids, events, fairness and rate policies."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pyrula.workflows.errors import JournalCorrupt
from pyrula.workflows.events import Event, EventType, dumps, loads, make_event
from pyrula.workflows.forks import fork_origin
from pyrula.workflows.records import RunError
from pyrula.workflows.schedules.schedule import Schedule

#: Internal key of the tenant of runs submitted without an ``owner``.
NO_OWNER = ""


def new_run_id(now: float | None = None) -> str:
    """A 32-hex-digit id that sorts by creation time (48-bit ms timestamp + 80 random bits)."""
    ms = int((time.time() if now is None else now) * 1000) & ((1 << 48) - 1)
    return f"{ms:012x}{os.urandom(10).hex()}"


def new_event_id(now: float | None = None) -> str:
    """An event's id: as a run id without a shard (sorts by emit time)."""
    return new_run_id(now)


def submitted_event(
    now: float, name: str, params: Any, owner: str | None, idempotency_key: str | None
) -> Event:
    event = make_event(EventType.RUN_SUBMITTED, now, name=name, params=params)
    if owner is not None:
        event["owner"] = owner
    if idempotency_key is not None:
        event["idempotency_key"] = idempotency_key
    return event


def journal_entry(run_id: str, seq: int, raw: str | bytes) -> Event:
    """Entry ``seq`` of a run's journal as stored, checked to be an event: a JSON object
    with a ``type`` (and an integer ``call`` if any). Raises JournalCorrupt naming the
    entry for anything else: the stores write only such entries, so another one was
    forged, truncated or overwritten in the store."""
    try:
        event = loads(raw)
    except ValueError as exc:  # orjson.JSONDecodeError
        raise JournalCorrupt(run_id, seq, f"is not JSON ({exc})") from None
    if not isinstance(event, dict):
        raise JournalCorrupt(run_id, seq, f"is not a JSON object (a {type(event).__name__})")
    type_ = event.get("type")
    if not isinstance(type_, str) or not type_:
        raise JournalCorrupt(run_id, seq, "has no type")
    call = event.get("call")
    if call is not None and (isinstance(call, bool) or not isinstance(call, int)):
        raise JournalCorrupt(run_id, seq, f"has call {call!r}, not an integer")
    event["seq"] = seq
    return event


def record_params(run_id: str, raw: str | bytes | None) -> Any:
    """A run record's params (they are its journal's entry 1, run:submitted)."""
    if raw is None or raw == "":
        return None
    try:
        return loads(raw)
    except ValueError as exc:
        raise JournalCorrupt(run_id, 1, f"(the run record's params) is not JSON ({exc})"
                             ) from None


def started_event(now: float, attempt: int, worker_id: str, build: str | None = None,
                  idempotency_key: str | None = None) -> Event:
    """``run:started`` of attempt ``attempt``; ``build``: the code the claimer serves (a
    claim without one, by a tool or an older build, records none). A fork's first one
    also names the run, call and step it was forked from (``forked_from``, ``from_call``,
    ``from_step``), read from its idempotency key (``forks.fork_origin``)."""
    event = make_event(EventType.RUN_STARTED, now, attempt=attempt, worker=worker_id)
    if build is not None:
        event["build"] = build
    origin = fork_origin(idempotency_key) if attempt == 1 else None
    if origin is not None:
        event.update(origin)
    return event


def requeued_event(now: float, reason: str, crashes: int | None = None,
                   detail: Mapping[str, Any] | None = None) -> Event:
    """``run:requeued``; a requeue that counted a crash against the run also says how many
    of its crashes count now (``crashes``). A requeue for a crash keeps its evidence
    (``detail``: the cause, the worker, and for a fleet child its pid, exit signal and
    RSS), so the journal alone tells how an attempt ended, not only a quarantine's error."""
    fields: dict[str, Any] = {"reason": reason}
    if crashes is not None:
        fields["crashes"] = crashes
    if detail:
        fields["detail"] = dict(detail)
    return make_event(EventType.RUN_REQUEUED, now, **fields)


def quarantine_error(crashes: int, detail: Mapping[str, Any] | None) -> dict[str, Any]:
    """The error of a run failed for crashing more than its poison policy allows."""
    detail = dict(detail or {})
    detail.setdefault("crashes", crashes)
    cause = str(detail.get("cause", "worker_crash"))
    error_type = "EventLoopBlocked" if cause == "loop_blocked" else "WorkerCrashed"
    return RunError(
        code="max_retries",
        error_type=str(detail.pop("error_type", error_type)),
        message=(
            f"run quarantined after {crashes} crashes (poison_max_retries exceeded); "
            f"last cause: {cause}"
        ),
        detail=detail,
    ).as_dict()


def error_event(now: float, error: Mapping[str, Any]) -> Event:
    """The ``run:error`` event that journals ``error`` (a ``RunInfo.error`` dict)."""
    return RunError.from_dict(error).event(now)


def live_crashes(crashes: Iterable[float], now: float, ttl: float) -> list[float]:
    return [t for t in crashes if now - t < ttl]


@dataclass(slots=True)
class TokenBucket:
    """``max_starts_per_second`` as a token bucket holding at most one second of starts."""

    tokens: float
    stamp: float

    def take(self, rate: float, now: float) -> bool:
        capacity = max(1.0, rate)
        self.tokens = min(capacity, self.tokens + max(0.0, now - self.stamp) * rate)
        self.stamp = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


def pick_owner(candidates: Mapping[str, tuple[float, float]]) -> str | None:
    """Deficit round robin: the least-served owner goes next, the oldest head breaking ties.

    ``candidates`` maps owner -> (served, created_at of its oldest queued run).
    """
    best: str | None = None
    best_key: tuple[float, float] | None = None
    for owner, key in candidates.items():
        if best_key is None or key < best_key:
            best, best_key = owner, key
    return best


def validate_flow_control(
    owner: str, max_concurrent: int | None, max_starts_per_second: float | None
) -> None:
    if not isinstance(owner, str):
        raise ValueError(f"owner must be a str, got {type(owner).__name__}")
    if max_concurrent is not None and (
        isinstance(max_concurrent, bool)
        or not isinstance(max_concurrent, int)
        or max_concurrent < 1
    ):
        raise ValueError(f"max_concurrent must be an int >= 1 or None, got {max_concurrent!r}")
    if max_starts_per_second is not None and (
        isinstance(max_starts_per_second, bool)
        or not isinstance(max_starts_per_second, int | float)
        or not 0 < max_starts_per_second < math.inf  # also refuses NaN
    ):
        raise ValueError(
            "max_starts_per_second must be a finite number > 0 or None, "
            f"got {max_starts_per_second!r}"
        )


def schedule_to_store(schedule: Any, now: float | None) -> tuple[Schedule, str]:
    """What ``schedule_create`` writes: the schedule armed at ``now`` (enabled, next run
    the first occurrence after now) and its definition as JSON."""
    if not isinstance(schedule, Schedule):
        raise TypeError(
            f"schedule_create takes a Schedule (Schedule.create(...)), got "
            f"{type(schedule).__name__}"
        )
    armed = schedule.armed(time.time() if now is None else now)
    return armed, dumps(armed.definition()).decode()


def schedule_from_store(
    definition: str | bytes,
    *,
    paused: bool,
    next_run_at: float,
    last_run_id: str | None,
    last_run_at: float | None,
) -> Schedule:
    return Schedule.from_record(
        loads(definition), paused=paused, next_run_at=next_run_at,
        last_run_id=last_run_id, last_run_at=last_run_at,
    )


def records_run(last_run_at: float | None, run_id: str | None, run_at: float | None) -> bool:
    """Whether ``schedule_advance`` records ``run_id`` as the last run: unless a run
    submitted later is recorded already."""
    if run_id is None:
        return False
    return last_run_at is None or run_at is None or run_at >= last_run_at
