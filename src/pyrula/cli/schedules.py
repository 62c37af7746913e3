"""``pyrula schedules``: create, list, delete, pause, resume and trigger schedules.

``create`` derives the schedule id from what the schedule does (its workflow, its cron
expression or interval, its params and its time zone), so running the same ``create``
again replaces that schedule instead of adding a second one. A schedule created in code
with ``store.schedule_create`` under an id of its own is a different schedule: mixing the
two paths makes two.

Output: a table for people, or with ``--json`` one JSON document on stdout. Exit 0 on
success, 1 for an unknown schedule id, 2 for a usage error (one line naming the flag).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import click

from pyrula.cli.common import NAMESPACE, STORE, InputError, existing_store, json_argument
from pyrula.cli.runs import warn_if_unknown
from pyrula.errors import ScheduleNotFound
from pyrula.timestamps import iso_of_datetime
from pyrula.workflows.schedules import OVERLAP_POLICIES, CronError, Schedule
from pyrula.workflows.schedules.cron import CronExpr
from pyrula.workflows.schedules.schedule import MIN_CATCHUP_WINDOW_S, MIN_INTERVAL_S, zone

logger = logging.getLogger(__name__)

#: How many hex digits of the digest a derived id keeps (64 bits: no collisions in
#: practice among one store's schedules).
ID_DIGEST_LENGTH = 16
#: The longest workflow-name prefix of a derived id.
ID_PREFIX_LENGTH = 64
_UNSAFE_ID_CHARS = re.compile(r"[^A-Za-z0-9_.:-]")
#: The table's columns: heading and how a schedule fills it.
_COLUMNS: tuple[tuple[str, Callable[[Schedule], str]], ...] = (
    ("ID", lambda s: s.schedule_id),
    ("WORKFLOW", lambda s: s.name),
    ("CRON/EVERY", lambda s: s.cron if s.cron is not None else f"every {_every_s(s)}s"),
    ("TIMEZONE", lambda s: s.timezone),
    ("NEXT RUN", lambda s: "-" if s.paused else _iso(s.next_run_at)),
    ("PAUSED", lambda s: "yes" if s.paused else "no"),
    ("LAST RUN", lambda s: "-" if s.last_run_id is None
     else f"{s.last_run_id} at {_iso(s.last_run_at)}"),
)

JSON_OUTPUT = click.option("--json", "as_json", is_flag=True,
                           help="print one JSON document instead of a table")


def derived_id(name: str, cron: str | None, every: int | None, params: Any,
               timezone: str) -> str:
    """The id ``pyrula schedules create`` gives a schedule: the workflow name (made safe
    for an id) and a digest of name, cron or interval, params and time zone. The same
    inputs always give the same id; params are compared as JSON, keys sorted."""
    canonical = json.dumps(
        {"name": name, "cron": cron, "every": every, "params": params, "timezone": timezone},
        sort_keys=True, separators=(",", ":"),
    )
    digest = hashlib.sha256(canonical.encode()).hexdigest()[:ID_DIGEST_LENGTH]
    prefix = _UNSAFE_ID_CHARS.sub("_", name)[:ID_PREFIX_LENGTH]
    return f"{prefix}-{digest}"


def schedule_document(sched: Schedule) -> dict[str, Any]:
    """A schedule as the ``--json`` output shows it (instants in ISO-8601, UTC)."""
    return {
        "schedule_id": sched.schedule_id,
        "workflow": sched.name,
        "cron": sched.cron,
        "every": None if sched.every is None else _every_s(sched),
        "params": sched.params,
        "timezone": sched.timezone,
        "overlap": sched.overlap,
        "catchup_window": (None if sched.catchup_window is None
                           else sched.catchup_window.total_seconds()),
        "paused": sched.paused,
        "next_run_at": None if sched.paused else iso_of_datetime(sched.next_run_at),
        "created_at": iso_of_datetime(sched.created_at),
        "last_run_id": sched.last_run_id,
        "last_run_at": None if sched.last_run_at is None else iso_of_datetime(sched.last_run_at),
    }


@click.group("schedules")
def schedules() -> None:
    """Schedules in the store: create, list, delete, pause, resume, run-now."""


@schedules.command("create")
@click.argument("name")
@click.option("--cron", default=None, metavar="EXPR", help="a five-field cron expression")
@click.option("--every", default=None, metavar="SECONDS",
              help="a fixed interval (whole seconds, at least 60)")
@click.option("--params", default="null", metavar="JSON", help="the runs' params")
@click.option("--timezone", default="UTC", show_default=True, metavar="TZ",
              help="the IANA time zone the cron expression runs in")
@click.option("--overlap", type=click.Choice(OVERLAP_POLICIES), default="skip",
              show_default=True, help="what an occurrence due while the last run is "
              "unfinished does")
@click.option("--catchup-window", default=None, metavar="SECONDS",
              help="after downtime, fire the missed occurrence only if this recent")
@JSON_OUTPUT
@STORE
@NAMESPACE
def create(name: str, cron: str | None, every: str | None, params: str, timezone: str,
           overlap: str, catchup_window: str | None, as_json: bool, store: str | None,
           namespace: str | None) -> None:
    """Create schedule of workflow NAME, or replace the one these options made before."""
    if (cron is None) == (every is None):
        raise InputError("give exactly one of --cron EXPR or --every SECONDS, "
                         + ("not both" if cron is not None else "got neither"))
    if cron is not None:
        try:
            CronExpr.parse(cron)
        except CronError as exc:
            raise InputError(f"--cron {cron!r}: {exc}") from None
    interval = None if every is None else _whole_seconds("--every", every, MIN_INTERVAL_S)
    window = (None if catchup_window is None
              else _seconds("--catchup-window", catchup_window, MIN_CATCHUP_WINDOW_S))
    value = json_argument("--params", params)
    try:
        zone(timezone)
    except ValueError as exc:
        raise InputError(f"--timezone: {exc}") from None
    schedule_id = derived_id(name, cron, interval, value, timezone)
    try:
        sched = Schedule.create(name, cron, value, schedule_id=schedule_id, timezone=timezone,
                                overlap=overlap, catchup_window=window, every=interval)
    except ValueError as exc:  # NAME (each flag was checked above)
        raise InputError(f"NAME {name!r}: {exc}") from None
    with _store(store, namespace) as opened:
        replaced = opened.schedule_get(schedule_id) is not None
        stored = opened.schedule_create(sched)
        warn_if_unknown(opened, sched.name, "; the schedule's runs wait until a worker "
                        "serves it")
    logger.info("schedule %s %s", schedule_id, "replaced" if replaced else "created",
                extra={"event": "schedule_created", "schedule_id": schedule_id})
    if as_json:
        _print_json({**schedule_document(stored), "replaced": replaced})
    else:
        click.echo(f"{'replaced' if replaced else 'created'} schedule {schedule_id}")
        _print_table([stored])


@schedules.command("list")
@click.argument("schedule_id", required=False)
@JSON_OUTPUT
@STORE
@NAMESPACE
def list_schedules(schedule_id: str | None, as_json: bool, store: str | None,
                   namespace: str | None) -> None:
    """List every schedule, by id; or show SCHEDULE_ID alone."""
    with _store(store, namespace) as opened:
        if schedule_id is None:
            found = opened.schedule_list()
        else:
            one = opened.schedule_get(schedule_id)
            if one is None:
                raise _unknown(schedule_id)
            found = [one]
    if as_json:
        _print_json([schedule_document(s) for s in found] if schedule_id is None
                    else schedule_document(found[0]))
    elif found:
        _print_table(found)
    else:
        click.echo("no schedules")


@schedules.command("delete")
@click.argument("schedule_id")
@JSON_OUTPUT
@STORE
@NAMESPACE
def delete(schedule_id: str, as_json: bool, store: str | None,
           namespace: str | None) -> None:
    """Delete SCHEDULE_ID (its runs are not touched)."""
    with _store(store, namespace) as opened:
        if not opened.schedule_delete(schedule_id):
            raise _unknown(schedule_id)
    _done(as_json, {"schedule_id": schedule_id, "deleted": True},
          f"deleted schedule {schedule_id}")


@schedules.command("pause")
@click.argument("schedule_id")
@JSON_OUTPUT
@STORE
@NAMESPACE
def pause(schedule_id: str, as_json: bool, store: str | None, namespace: str | None) -> None:
    """Stop SCHEDULE_ID firing until resumed (a run in flight goes on)."""
    from pyrula.workflows.schedules.control import pause_schedule

    with _store(store, namespace) as opened:
        _known(schedule_id, lambda: pause_schedule(opened, schedule_id))
    _done(as_json, {"schedule_id": schedule_id, "paused": True},
          f"paused schedule {schedule_id}")


@schedules.command("resume")
@click.argument("schedule_id")
@JSON_OUTPUT
@STORE
@NAMESPACE
def resume(schedule_id: str, as_json: bool, store: str | None, namespace: str | None) -> None:
    """Let SCHEDULE_ID fire again, from its first occurrence after now."""
    from pyrula.workflows.schedules.control import resume_schedule

    with _store(store, namespace) as opened:
        _known(schedule_id, lambda: resume_schedule(opened, schedule_id))
        resumed = opened.schedule_get(schedule_id)
    next_run = None if resumed is None else iso_of_datetime(resumed.next_run_at)
    _done(as_json, {"schedule_id": schedule_id, "paused": False, "next_run_at": next_run},
          f"resumed schedule {schedule_id}; next run {next_run}")


@schedules.command("run-now")
@click.argument("schedule_id")
@JSON_OUTPUT
@STORE
@NAMESPACE
def run_now(schedule_id: str, as_json: bool, store: str | None,
            namespace: str | None) -> None:
    """Submit one run of SCHEDULE_ID at once (paused or not)."""
    from pyrula.workflows.schedules.control import run_schedule_now

    with _store(store, namespace) as opened:
        handle = _known(schedule_id, lambda: run_schedule_now(opened, schedule_id))
    _done(as_json, {"schedule_id": schedule_id, "run_id": handle.run_id,
                    "workflow": handle.name},
          f"submitted run {handle.run_id} of {handle.name}")


# --- helpers ---------------------------------------------------------------------------

@contextmanager
def _store(url: str | None, namespace: str | None) -> Iterator[Any]:
    opened = existing_store(url, namespace)
    try:
        yield opened
    finally:
        opened.close()


def _known(schedule_id: str, call: Callable[[], Any]) -> Any:
    try:
        return call()
    except ScheduleNotFound:
        raise _unknown(schedule_id) from None


def _unknown(schedule_id: str) -> click.ClickException:
    """Exit 1, one line: the id asked about is not in the store."""
    return click.ClickException(
        f"no schedule with id {schedule_id!r} (see `pyrula schedules list`)"
    )


def _whole_seconds(flag: str, text: str, minimum: float) -> int:
    seconds = _seconds(flag, text, minimum)
    if seconds != int(seconds):
        raise InputError(f"{flag} must be a whole number of seconds, got {text!r}")
    return int(seconds)


def _seconds(flag: str, text: str, minimum: float) -> float:
    try:
        seconds = float(text)
    except ValueError:
        raise InputError(f"{flag} must be a number of seconds, got {text!r}") from None
    if not math.isfinite(seconds) or seconds < minimum:
        raise InputError(f"{flag} must be at least {minimum:g} seconds, got {text!r}")
    return seconds


def _every_s(sched: Schedule) -> int:
    assert sched.every is not None
    return int(sched.every.total_seconds())


def _iso(at: datetime | None) -> str:
    """An instant as the table shows it: UTC to the second, ``2026-12-01T16:40:00Z``."""
    if at is None:
        return "-"
    return at.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _done(as_json: bool, document: dict[str, Any], line: str) -> None:
    if as_json:
        _print_json(document)
    else:
        click.echo(line)


def _print_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2))


def _print_table(found: Sequence[Schedule]) -> None:
    rows = [[fill(s) for _, fill in _COLUMNS] for s in found]
    widths = [max(len(heading), *(len(row[i]) for row in rows))
              for i, (heading, _) in enumerate(_COLUMNS)]
    for row in [[heading for heading, _ in _COLUMNS], *rows]:
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths,
                                                                       strict=True)).rstrip())
