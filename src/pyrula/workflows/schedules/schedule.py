"""``Schedule``: a workflow submitted on a cron expression or a fixed interval. Pure.

Occurrences are instants (aware UTC datetimes, whole seconds):

- ``every``: a grid from the creation time (its whole second): ``created + k * every``
  for k >= 1.
- ``cron``: the expression runs on wall-clock time in ``timezone``. A wall time that occurs
  twice (fall back) fires once, at its first occurrence; wall times skipped by spring
  forward fire once, at the first instant after the gap (with any time right after the gap
  that matches too: still once).

The stores keep a schedule as its JSON ``definition()`` plus its state (``paused``,
``next_run_at``, ``last_run_id``, ``last_run_at``); the worker's schedule loop fires it
(see ``plan`` in policy.py).
"""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from pyrula.workflows.definition import workflow_name
from pyrula.workflows.events import dumps, loads
from pyrula.workflows.schedules.cron import CronExpr

if TYPE_CHECKING:
    from zoneinfo import ZoneInfo

OVERLAP_POLICIES = ("skip", "allow")
#: The shortest interval and the shortest catch-up window, in seconds.
MIN_INTERVAL_S = 60
MIN_CATCHUP_WINDOW_S = 60
#: Schedule ids: printable, no whitespace, at most this long.
MAX_ID_LENGTH = 200
_ID = re.compile(r"^[^\s\x00-\x1f\x7f]+$")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _workflow(name: Any) -> str:
    """The workflow a schedule runs, from a name or a ``@workflow``; ValueError if none."""
    try:
        wf = workflow_name(name)
    except TypeError as exc:
        raise ValueError(str(exc)) from None
    if not wf:
        raise ValueError("schedule workflow name must be a non-empty str")
    return str(wf)


def _timing(cron: str | None, every: timedelta | float | None) -> timedelta | None:
    """Check that exactly one of ``cron`` and ``every`` is given, and it is valid; the
    interval (None for a cron schedule)."""
    if (cron is None) == (every is None):
        raise ValueError(
            "a schedule needs exactly one of cron=... or every=..., "
            + ("got both" if cron is not None else "got neither")
        )
    if cron is not None:
        CronExpr.parse(cron)  # raises CronError (a ValueError) naming the field
    return None if every is None else _interval(every)


@dataclass(frozen=True, slots=True)
class Schedule:
    """A schedule and its state. Build one with ``Schedule.create``; read them back with
    ``store.schedule_list()``.

    ``next_run_at`` is the next occurrence to fire (aware UTC). ``last_run_id`` is the run
    it submitted last (the ``overlap`` check looks at it) and ``last_run_at`` when.
    """

    schedule_id: str
    name: str
    cron: str | None
    every: timedelta | None
    params: Any
    timezone: str
    overlap: str
    catchup_window: timedelta | None
    paused: bool
    next_run_at: datetime
    created_at: datetime
    last_run_id: str | None = None
    last_run_at: datetime | None = None

    @classmethod
    def create(
        cls,
        name: Any,
        cron: str | None = None,
        params: Any = None,
        *,
        schedule_id: str | None = None,
        timezone: str = "UTC",
        overlap: str = "skip",
        catchup_window: timedelta | float | None = None,
        every: timedelta | float | None = None,
        created_at: datetime | float | None = None,
    ) -> Schedule:
        """Validate and build a schedule of workflow ``name`` (a name or a ``@workflow``).

        Exactly one of ``cron`` and ``every`` (a timedelta or seconds, at least 60 s, whole
        seconds). ``schedule_id`` None mints a new id. ``catchup_window`` (at least 60 s):
        after downtime, the missed occurrence fires only if it is that recent.
        ``created_at`` (default now) anchors an interval's grid. Raises ValueError naming
        what is wrong.
        """
        wf = _workflow(name)
        if schedule_id is None:
            schedule_id = uuid.uuid4().hex
        _check_id(schedule_id)
        interval = _timing(cron, every)
        zone(timezone)
        if overlap not in OVERLAP_POLICIES:
            raise ValueError(
                f"overlap must be one of {', '.join(map(repr, OVERLAP_POLICIES))}, "
                f"got {overlap!r}"
            )
        window = None if catchup_window is None else _catchup_window(catchup_window)
        try:
            stored_params = loads(dumps({} if params is None else params))
        except TypeError as exc:
            raise ValueError(f"params of schedule {schedule_id!r} are {exc}") from None
        created = _instant(datetime.now(UTC) if created_at is None else created_at, "created_at")
        sched = cls(
            schedule_id=schedule_id,
            name=wf,
            cron=cron,
            every=interval,
            params=stored_params,
            timezone=timezone,
            overlap=overlap,
            catchup_window=window,
            paused=False,
            next_run_at=created,
            created_at=created,
        )
        return replace(sched, next_run_at=sched.next_after(created))

    # --- occurrences ----------------------------------------------------------------

    def next_after(self, dt: datetime | float) -> datetime:
        """The first occurrence strictly after ``dt`` (aware, or naive read as UTC; or
        epoch seconds), as an aware UTC datetime."""
        t = _instant(dt, "dt")
        if self.every is not None:
            anchor = self._anchor()
            steps = max(0, (t - anchor) // self.every) + 1
            return anchor + steps * self.every
        assert self.cron is not None
        tz = zone(self.timezone)
        local = t.astimezone(tz)
        for wall in CronExpr.parse(self.cron).walls_after(local.replace(tzinfo=None)):
            at = fire_instant(wall, tz)
            if at > t:  # walls in the second pass of a fall back map to the first: earlier
                return at
        raise AssertionError("unreachable: a valid cron expression fires again")

    def last_at_or_before(self, dt: datetime | float) -> datetime | None:
        """The latest occurrence at or before ``dt``, or None if there is none."""
        t = _instant(dt, "dt")
        if self.every is not None:
            anchor = self._anchor()
            steps = (t - anchor) // self.every
            return anchor + steps * self.every if steps >= 1 else None
        assert self.cron is not None
        tz = zone(self.timezone)
        local = t.astimezone(tz)
        start = local.replace(tzinfo=None)
        if local.fold:
            # In the second pass of a fall back the later walls of the first pass have
            # already fired: start where the repeated hour ends.
            first_offset = local.replace(fold=0).utcoffset()
            second_offset = local.utcoffset()
            assert first_offset is not None and second_offset is not None
            start += first_offset - second_offset
        for wall in CronExpr.parse(self.cron).walls_at_or_before(start):
            at = fire_instant(wall, tz)
            if at <= t:
                return at
        return None

    def _anchor(self) -> datetime:
        return self.created_at.replace(microsecond=0)

    # --- records --------------------------------------------------------------------

    def definition(self) -> dict[str, Any]:
        """What the stores keep as JSON (the state travels beside it)."""
        return {
            "v": 1,
            "schedule_id": self.schedule_id,
            "name": self.name,
            "cron": self.cron,
            "every": None if self.every is None else self.every.total_seconds(),
            "params": self.params,
            "timezone": self.timezone,
            "overlap": self.overlap,
            "catchup_window": (
                None if self.catchup_window is None else self.catchup_window.total_seconds()
            ),
            "created_at": self.created_at.timestamp(),
        }

    @classmethod
    def from_record(
        cls,
        definition: Mapping[str, Any],
        *,
        paused: bool,
        next_run_at: float,
        last_run_id: str | None = None,
        last_run_at: float | None = None,
    ) -> Schedule:
        """A schedule as a store read it back (``definition()`` plus its state)."""
        every = definition.get("every")
        window = definition.get("catchup_window")
        return cls(
            schedule_id=str(definition["schedule_id"]),
            name=str(definition["name"]),
            cron=definition.get("cron"),
            every=None if every is None else timedelta(seconds=float(every)),
            params=definition.get("params"),
            timezone=str(definition.get("timezone") or "UTC"),
            overlap=str(definition.get("overlap") or "skip"),
            catchup_window=None if window is None else timedelta(seconds=float(window)),
            paused=bool(paused),
            next_run_at=datetime.fromtimestamp(float(next_run_at), UTC),
            created_at=datetime.fromtimestamp(float(definition["created_at"]), UTC),
            last_run_id=last_run_id or None,
            last_run_at=None if last_run_at is None else datetime.fromtimestamp(
                float(last_run_at), UTC),
        )

    def armed(self, now: float) -> Schedule:
        """This schedule as ``schedule_create`` stores it at ``now``: enabled, its next
        occurrence the first after ``now``."""
        return replace(self, paused=False, next_run_at=self.next_after(now))


def idempotency_key(schedule_id: str, occurrence: datetime | float) -> str:
    """``schedule:{id}:{epoch}``: the key of the run an occurrence submits."""
    return f"schedule:{schedule_id}:{epoch(occurrence)}"


def epoch(at: datetime | float) -> int:
    """An occurrence as unix seconds (occurrences are whole seconds)."""
    seconds = at.timestamp() if isinstance(at, datetime) else float(at)
    return math.floor(seconds)


@lru_cache(maxsize=256)
def zone(name: str) -> ZoneInfo:
    """The IANA time zone ``name``; ValueError if there is no such zone."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"timezone must be an IANA time zone name, got {name!r}")
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError  # on first use: off a start's path

    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ValueError(f"unknown timezone {name!r} (use an IANA name such as "
                         "'Europe/Berlin' or 'UTC')") from None


def fire_instant(wall: datetime, tz: ZoneInfo) -> datetime:
    """When a matching naive wall time in ``tz`` fires, as an aware UTC datetime.

    A wall time that occurs twice fires at its first occurrence; one in a spring-forward
    gap fires at the first instant after the gap.
    """
    first = wall.replace(tzinfo=tz, fold=0).astimezone(UTC)
    second = wall.replace(tzinfo=tz, fold=1).astimezone(UTC)
    if first <= second:  # an ordinary time (equal) or one that occurs twice
        return first
    # In a gap fold=0 reads the wall with the offset from before the transition (an
    # instant after it) and fold=1 with the offset after (an instant before it): the
    # transition lies between. Bisect for it, in whole seconds.
    after = first.astimezone(tz).utcoffset()
    low, high = math.floor(second.timestamp()), math.ceil(first.timestamp())
    while high - low > 1:
        mid = (low + high) // 2
        if datetime.fromtimestamp(mid, UTC).astimezone(tz).utcoffset() == after:
            high = mid
        else:
            low = mid
    return datetime.fromtimestamp(high, UTC)


def _instant(value: datetime | float, what: str) -> datetime:
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return _EPOCH + timedelta(seconds=float(value))
    raise ValueError(f"{what} must be a datetime or epoch seconds, got {value!r}")


def _seconds(value: timedelta | float, what: str) -> float:
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    raise ValueError(f"{what} must be a timedelta or a number of seconds, got {value!r}")


def _interval(every: timedelta | float) -> timedelta:
    seconds = _seconds(every, "every")
    if seconds < MIN_INTERVAL_S:
        raise ValueError(f"every must be at least {MIN_INTERVAL_S} s, got {seconds:g} s")
    if seconds != int(seconds):
        raise ValueError(f"every must be a whole number of seconds, got {seconds:g} s")
    return timedelta(seconds=int(seconds))


def _catchup_window(window: timedelta | float) -> timedelta:
    seconds = _seconds(window, "catchup_window")
    if seconds < MIN_CATCHUP_WINDOW_S:
        raise ValueError(
            f"catchup_window must be at least {MIN_CATCHUP_WINDOW_S} s or None, got {seconds:g} s"
        )
    return timedelta(seconds=seconds)


def _check_id(schedule_id: Any) -> None:
    if (
        not isinstance(schedule_id, str)
        or not 0 < len(schedule_id) <= MAX_ID_LENGTH
        or not _ID.match(schedule_id)
    ):
        raise ValueError(
            f"schedule_id must be a non-empty str of at most {MAX_ID_LENGTH} characters "
            f"without whitespace or control characters, got {schedule_id!r}"
        )
