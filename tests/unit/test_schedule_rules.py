"""Schedule rules, pure: cron on wall-clock time across DST, day-of-month/day-of-week OR,
interval grids, validation, and the loop's plan for a due schedule."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, date, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from pyrula.workflows.schedules import Schedule, idempotency_key
from pyrula.workflows.schedules.cron import CronError, CronExpr
from pyrula.workflows.schedules.policy import plan

BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def cron(expr: str, tz: str = "UTC", start: datetime = utc(2026, 1, 1)) -> Schedule:
    return Schedule.create("report", expr, schedule_id="s", timezone=tz, created_at=start)


def fires(sched: Schedule, start: datetime, end: datetime) -> list[datetime]:
    """Every occurrence in (start, end], by repeated next_after."""
    out, t = [], start
    while (t := sched.next_after(t)) <= end:
        out.append(t)
    return out


def local(times: list[datetime], tz: ZoneInfo) -> list[str]:
    return [t.astimezone(tz).strftime("%m-%d %H:%M %Z") for t in times]


# --- DST ----------------------------------------------------------------------------------

# 2026 transitions: Berlin springs forward on 03-29 at 02:00 CET (to 03:00 CEST) and falls
# back on 10-25 at 03:00 CEST (to 02:00 CET); New York on 03-08 at 02:00 EST and 11-01 at
# 02:00 EDT.


def test_berlin_spring_forward_fires_a_skipped_time_once_after_the_gap() -> None:
    sched = cron("30 2 * * *", "Europe/Berlin")
    got = fires(sched, utc(2026, 3, 27), utc(2026, 3, 31))
    assert local(got, BERLIN) == [
        "03-27 02:30 CET", "03-28 02:30 CET", "03-29 03:00 CEST", "03-30 02:30 CEST",
    ]


def test_berlin_spring_forward_collapses_the_gap_and_the_time_after_it_into_one() -> None:
    sched = cron("*/15 * * * *", "Europe/Berlin")
    got = fires(sched, utc(2026, 3, 29, 0, 30), utc(2026, 3, 29, 1, 30))
    assert local(got, BERLIN) == [
        "03-29 01:45 CET", "03-29 03:00 CEST", "03-29 03:15 CEST", "03-29 03:30 CEST",
    ]


def test_berlin_fall_back_fires_a_repeated_time_once_at_its_first_occurrence() -> None:
    sched = cron("30 2 * * *", "Europe/Berlin")
    got = fires(sched, utc(2026, 10, 24), utc(2026, 10, 27))
    assert got == [utc(2026, 10, 24, 0, 30), utc(2026, 10, 25, 0, 30), utc(2026, 10, 26, 1, 30)]
    assert local(got, BERLIN)[1] == "10-25 02:30 CEST"


def test_berlin_fall_back_skips_the_second_pass_of_the_repeated_hour() -> None:
    sched = cron("*/30 * * * *", "Europe/Berlin")
    got = fires(sched, utc(2026, 10, 24, 23, 45), utc(2026, 10, 25, 2, 30))
    assert local(got, BERLIN) == [
        "10-25 02:00 CEST", "10-25 02:30 CEST", "10-25 03:00 CET", "10-25 03:30 CET",
    ]


def test_new_york_spring_forward_and_fall_back() -> None:
    spring = cron("30 2 * * *", "America/New_York")
    assert local(fires(spring, utc(2026, 3, 7), utc(2026, 3, 10)), NEW_YORK) == [
        "03-07 02:30 EST", "03-08 03:00 EDT", "03-09 02:30 EDT",
    ]
    fall = cron("30 1 * * *", "America/New_York")
    got = fires(fall, utc(2026, 10, 31), utc(2026, 11, 3))
    assert local(got, NEW_YORK) == ["10-31 01:30 EDT", "11-01 01:30 EDT", "11-02 01:30 EST"]


@pytest.mark.parametrize(
    ("tz", "expr"),
    [
        ("Europe/Berlin", "0 2 * * *"),
        ("Europe/Berlin", "30 2 * * *"),
        ("America/New_York", "30 1 * * *"),
        ("America/New_York", "0 2 * * *"),
        ("Australia/Lord_Howe", "15 2 * * *"),  # a 30-minute shift
        ("Australia/Lord_Howe", "45 1 * * *"),
        ("UTC", "0 2 * * *"),
    ],
)
def test_a_daily_schedule_fires_once_on_every_local_day_of_a_year(tz: str, expr: str) -> None:
    sched = cron(expr, tz)
    got = fires(sched, utc(2026, 1, 1), utc(2027, 1, 1))
    per_day = Counter(t.astimezone(ZoneInfo(tz)).date() for t in got)
    days = {date(2026, 1, 1) + timedelta(days=i) for i in range(365)}
    # the last occurrence may fall on 2027-01-01 local time in a zone east of UTC
    assert set(per_day) - {date(2027, 1, 1)} <= days
    assert days - {date(2026, 1, 1)} <= set(per_day)
    assert max(per_day.values()) == 1


def test_every_quarter_hour_over_the_berlin_transition_days() -> None:
    sched = cron("*/15 * * * *", "Europe/Berlin")
    spring = fires(sched, utc(2026, 3, 28, 23), utc(2026, 3, 29, 22))  # the local day
    fall = fires(sched, utc(2026, 10, 24, 22), utc(2026, 10, 25, 23))
    assert len(spring) == 92  # 23 hours; the four skipped quarters fire once, at 03:00
    assert len(fall) == 96  # 25 hours; the repeated hour fires once
    assert len(set(spring)) == len(spring) and len(set(fall)) == len(fall)


def test_utc_schedules_keep_their_wall_time() -> None:
    sched = cron("0 2 * * *")
    got = fires(sched, utc(2026, 3, 28), utc(2026, 3, 31))
    assert got == [utc(2026, 3, 28, 2), utc(2026, 3, 29, 2), utc(2026, 3, 30, 2)]


def test_the_latest_occurrence_in_the_second_pass_of_a_fall_back() -> None:
    sched = cron("*/30 * * * *", "Europe/Berlin")
    # 01:15 UTC is 02:15 CET, the second pass: the latest fire was 02:30 CEST (00:30 UTC)
    assert sched.last_at_or_before(utc(2026, 10, 25, 1, 15)) == utc(2026, 10, 25, 0, 30)
    assert sched.last_at_or_before(utc(2026, 10, 25, 2, 0)) == utc(2026, 10, 25, 2, 0)
    assert sched.last_at_or_before(utc(2026, 10, 25, 1, 59, 59)) == utc(2026, 10, 25, 0, 30)


def test_the_latest_occurrence_after_a_spring_forward() -> None:
    sched = cron("30 2 * * *", "Europe/Berlin")
    assert sched.last_at_or_before(utc(2026, 3, 29, 5)) == utc(2026, 3, 29, 1)


@pytest.mark.parametrize(
    ("expr", "at", "latest"),
    [
        # At the time itself, else the day before, else the last weekday named.
        ("0 9 * * *", utc(2026, 3, 10, 9), utc(2026, 3, 10, 9)),
        ("0 9 * * *", utc(2026, 3, 10, 8), utc(2026, 3, 9, 9)),
        ("0 9 * * mon", utc(2026, 3, 10, 8), utc(2026, 3, 9, 9)),  # 03-10 is a Tuesday
        ("0 9 * * wed", utc(2026, 3, 10, 8), utc(2026, 3, 4, 9)),
        # Back over the months the expression does not name, to the last day it fires.
        ("0 9 1 2 *", utc(2026, 3, 15), utc(2026, 2, 1, 9)),
        ("0 9 1 2 *", utc(2026, 1, 15), utc(2025, 2, 1, 9)),
        ("0 0 31 1 *", utc(2026, 3, 15), utc(2026, 1, 31)),
        ("0 0 29 2 *", utc(2026, 3, 15), utc(2024, 2, 29)),
        ("30 23 * 1,3 *", utc(2026, 3, 1, 12), utc(2026, 1, 31, 23, 30)),
    ],
)
def test_the_latest_occurrence_is_found_days_and_months_back(
        expr: str, at: datetime, latest: datetime) -> None:
    assert cron(expr).last_at_or_before(at) == latest


def test_cron_walls_after_a_time_exclude_it_and_walls_before_include_it() -> None:
    nine = datetime(2026, 1, 1, 9)
    expr = CronExpr.parse("0 9,17 * * *")
    after = expr.walls_after(nine)
    assert [next(after) for _ in range(3)] == [
        datetime(2026, 1, 1, 17), datetime(2026, 1, 2, 9), datetime(2026, 1, 2, 17)]
    before = expr.walls_at_or_before(nine)
    assert [next(before) for _ in range(3)] == [
        nine, datetime(2025, 12, 31, 17), datetime(2025, 12, 31, 9)]


def test_a_search_back_ends_at_year_one() -> None:
    walls = CronExpr.parse("0 12 * * *").walls_at_or_before(datetime(1, 1, 3, 11))
    assert list(walls) == [datetime(1, 1, 2, 12), datetime(1, 1, 1, 12)]


@pytest.mark.parametrize(
    ("expr", "day", "matches"),
    [
        ("0 0 1 2 *", date(2026, 2, 1), True),
        ("0 0 1 2 *", date(2026, 3, 1), False),  # a month it does not name
        ("0 0 1 2 *", date(2026, 2, 2), False),
        ("0 0 * 2 mon", date(2026, 2, 2), True),
        ("0 0 * 2 mon", date(2026, 3, 2), False),
        ("0 0 13 * fri", date(2026, 3, 6), True),  # both restricted: either
        ("0 0 13 * fri", date(2026, 3, 7), False),
    ],
)
def test_cron_matches_a_day(expr: str, day: date, matches: bool) -> None:
    assert CronExpr.parse(expr).matches_day(day) is matches


# --- cron fields --------------------------------------------------------------------------


def test_both_day_fields_restricted_match_either() -> None:
    sched = cron("0 0 13 * fri")
    got = [t.date() for t in fires(sched, utc(2026, 2, 1), utc(2026, 3, 31))]
    fridays = [date(2026, 2, d) for d in (6, 13, 20, 27)] + [
        date(2026, 3, d) for d in (6, 20, 27)
    ]
    assert got == sorted(fridays + [date(2026, 3, 13)])  # Feb 13 is a Friday too


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("0 0 * * fri", [6, 13, 20, 27]),
        ("0 0 13 * *", [13]),
        ("0 0 */2 * 5", [13, 27]),  # a star-prefixed day field: both must match
        ("0 0 ? * 5", [6, 13, 20, 27]),
        ("0 0 1 * ?", [1]),  # '?' leaves the day of the week unrestricted, as '*' does
        ("0 0 1,15 * 7", [1, 8, 15, 22]),  # 7 is Sunday; both restricted: either
    ],
)
def test_day_fields(expr: str, expected: list[int]) -> None:
    sched = cron(expr)
    got = [t.day for t in fires(sched, utc(2026, 1, 31), utc(2026, 2, 28))]
    assert got == expected


@pytest.mark.parametrize(
    ("expr", "first_three"),
    [
        ("@hourly", [utc(2026, 1, 1, 1), utc(2026, 1, 1, 2), utc(2026, 1, 1, 3)]),
        ("@daily", [utc(2026, 1, 2), utc(2026, 1, 3), utc(2026, 1, 4)]),
        ("@monthly", [utc(2026, 2, 1), utc(2026, 3, 1), utc(2026, 4, 1)]),
        ("@yearly", [utc(2027, 1, 1), utc(2028, 1, 1), utc(2029, 1, 1)]),
        ("0 0 29 2 *", [utc(2028, 2, 29), utc(2032, 2, 29), utc(2036, 2, 29)]),
        ("5/20 9-10 * jan-feb mon-fri",
         [utc(2026, 1, 1, 9, 5), utc(2026, 1, 1, 9, 25), utc(2026, 1, 1, 9, 45)]),
    ],
)
def test_macros_names_ranges_and_steps(expr: str, first_three: list[datetime]) -> None:
    sched = cron(expr)
    t, got = utc(2026, 1, 1), []
    for _ in range(3):
        t = sched.next_after(t)
        got.append(t)
    assert got == first_three


# --- intervals ----------------------------------------------------------------------------


def test_interval_occurrences_sit_on_a_grid_from_the_creation_time() -> None:
    created = datetime(2026, 5, 1, 12, 0, 30, 700_000, tzinfo=UTC)
    sched = Schedule.create("report", every=timedelta(minutes=5), created_at=created)
    assert sched.next_run_at == utc(2026, 5, 1, 12, 5, 30)
    assert sched.next_after(utc(2026, 5, 1, 12, 7)) == utc(2026, 5, 1, 12, 10, 30)
    assert sched.next_after(utc(2026, 5, 1, 12, 10, 30)) == utc(2026, 5, 1, 12, 15, 30)
    assert sched.next_after(utc(2026, 4, 1)) == utc(2026, 5, 1, 12, 5, 30)  # before creation
    assert sched.last_at_or_before(utc(2026, 5, 1, 12, 10, 30)) == utc(2026, 5, 1, 12, 10, 30)
    assert sched.last_at_or_before(utc(2026, 5, 1, 12, 5)) is None
    # across DST the grid is in absolute time
    dst = Schedule.create("r", every=3600, timezone="Europe/Berlin", created_at=utc(2026, 3, 29))
    assert fires(dst, utc(2026, 3, 29), utc(2026, 3, 29, 4)) == [
        utc(2026, 3, 29, h) for h in (1, 2, 3, 4)
    ]


def test_next_after_reads_naive_as_utc_and_answers_in_utc() -> None:
    sched = cron("0 * * * *")
    naive = sched.next_after(datetime(2026, 6, 1, 10, 30))
    aware = sched.next_after(datetime(2026, 6, 1, 12, 30, tzinfo=BERLIN))  # 10:30 UTC
    assert naive == aware == utc(2026, 6, 1, 11)
    assert naive.tzinfo is UTC
    assert sched.next_after(utc(2026, 6, 1, 11)) == utc(2026, 6, 1, 12)  # strictly after


def test_create_computes_next_run_at_and_mints_ids() -> None:
    a = Schedule.create("report", "0 2 * * *", created_at=utc(2026, 1, 1, 3))
    b = Schedule.create("report", "0 2 * * *", created_at=utc(2026, 1, 1, 3))
    assert a.schedule_id != b.schedule_id
    assert a.next_run_at == utc(2026, 1, 2, 2)
    assert a.paused is False and a.overlap == "skip" and a.timezone == "UTC"
    assert a.catchup_window is None and a.every is None and a.params == {}


def test_a_schedule_round_trips_through_its_record() -> None:
    sched = Schedule.create(
        "report", "0 2 * * *", {"window": "24h", "n": 1.5}, schedule_id="nightly",
        timezone="Europe/Berlin", overlap="allow", catchup_window=timedelta(minutes=10),
    )
    back = Schedule.from_record(
        sched.definition(), paused=False, next_run_at=sched.next_run_at.timestamp()
    )
    assert back == sched


# --- validation ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cron": "61 * * * *"}, "minute field '61'"),
        ({"cron": "* * *"}, "3 fields"),
        ({"cron": "* * * * * *"}, "6 fields"),
        ({"cron": "@reboot"}, "unknown macro"),
        ({"cron": "0 0 30 2 *"}, "never fires"),
        ({"cron": "0 0 L * *"}, "not supported"),
        ({"cron": "0 0 * * 1#2"}, "not supported"),
        ({"cron": "0 25 * * *"}, "hour field"),
        ({"cron": "0 0 * * mon-sun7"}, "day-of-week"),
        ({"cron": "0 0 5-1 * *"}, "backwards"),
        ({"cron": "*/0 * * * *"}, "step"),
        ({"cron": "? * * * *"}, "only the day fields"),
        ({"cron": ""}, "empty"),
        ({"every": 30}, "at least 60 s"),
        ({"every": timedelta(seconds=59)}, "at least 60 s"),
        ({"every": timedelta(seconds=90.5)}, "whole number of seconds"),
        ({"every": "5m"}, "every must be a timedelta"),
        ({"cron": "* * * * *", "every": 60}, "exactly one of cron"),
        ({}, "got neither"),
        ({"cron": "* * * * *", "timezone": "Mars/Olympus"}, "unknown timezone 'Mars/Olympus'"),
        ({"cron": "* * * * *", "timezone": ""}, "timezone"),
        ({"cron": "* * * * *", "overlap": "queue"}, "overlap must be one of"),
        ({"cron": "* * * * *", "catchup_window": 30}, "catchup_window must be at least 60"),
        ({"cron": "* * * * *", "catchup_window": timedelta(0)}, "catchup_window"),
        ({"cron": "* * * * *", "params": {"when": object()}}, "params of schedule"),
        ({"cron": "* * * * *", "schedule_id": ""}, "schedule_id"),
        ({"cron": "* * * * *", "schedule_id": "has space"}, "schedule_id"),
    ],
)
def test_bad_input_is_refused_naming_what_is_wrong(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("*", r"\*").replace("?", r"\?")):
        Schedule.create("report", **kwargs)


@pytest.mark.parametrize(
    ("expr", "why"),
    [
        ("0 0 L * *", "day-of-month field 'L' uses 'l', which is not supported"),
        ("0 0 W * *", "day-of-month field 'W' uses 'w', which is not supported"),
        ("0 0 15W * *", "day-of-month field '15W' uses '15w', which is not supported"),
        ("0 0 * * 5L", "day-of-week field '5L' uses '5l', which is not supported"),
        ("0 0 * * 1#2", "day-of-week field '1#2' uses '1#2', which is not supported"),
        ("x * * * *", "minute field 'x' has 'x', which is not a number"),
        ("0 0 * foo *", "month field 'foo' has 'foo', which is not a number or a name "
                        "(jan, feb, mar, apr, may, jun, jul, aug, sep, oct, nov, dec)"),
        ("0 0 * * funday", "day-of-week field 'funday' has 'funday', which is not a number "
                           "or a name (sun, mon, tue, wed, thu, fri, sat)"),
        ("61 * * * *", "minute field '61' has 61, outside 0-59"),
        ("1-2-3 * * * *", "minute field '1-2-3' has '2-3', which is not a number"),
        ("1,,2 * * * *", "minute field '1,,2' has an empty list item"),
        ("*/x * * * *", "minute field '*/x' has step 'x'; a step must be a whole number >= 1"),
        ("*/0 * * * *", "minute field '*/0' has step '0'; a step must be a whole number >= 1"),
        ("? * * * *", "minute field '?' uses '?', which only the day fields accept"),
    ],
)
def test_a_bad_cron_field_is_refused_saying_what_is_wrong(expr: str, why: str) -> None:
    with pytest.raises(CronError) as caught:
        CronExpr.parse(expr)
    assert str(caught.value) == f"invalid cron expression {expr!r}: {why}"


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("", "invalid cron expression '': it is empty"),
        ("@reboot", "invalid cron expression '@reboot': unknown macro '@reboot' (supported: "
                    "@yearly, @annually, @monthly, @weekly, @daily, @midnight, @hourly)"),
        ("* * *", "invalid cron expression '* * *': it has 3 fields, cron needs 5 (minute "
                  "hour day-of-month month day-of-week)"),
        ("0 0 30 2 *", "invalid cron expression '0 0 30 2 *': it never fires (no month it "
                       "names has such a day)"),
        (5, "cron expression must be a str, got int"),
    ],
)
def test_a_bad_cron_expression_is_refused_saying_why(expr: Any, message: str) -> None:
    with pytest.raises(CronError) as caught:
        CronExpr.parse(expr)
    assert str(caught.value) == message


@pytest.mark.parametrize(
    ("expr", "minutes", "days", "weekdays"),
    [
        ("*/1 * * * *", list(range(60)), range(1, 32), range(7)),
        ("0 0 ? * *", [0], range(1, 32), range(7)),
        ("0 0 * * ?", [0], range(1, 32), range(7)),
        ("0 0 1 * sun,7", [0], [1], [0]),
        ("0 0 5-5 * *", [0], [5], range(7)),  # a range of one day
    ],
)
def test_steps_of_one_and_question_marks_in_the_day_fields_are_accepted(
        expr: str, minutes: list[int], days: range, weekdays: range) -> None:
    parsed = CronExpr.parse(expr)
    assert parsed.text == expr
    assert list(parsed.minutes) == minutes
    assert parsed.days == frozenset(days) and parsed.weekdays == frozenset(weekdays)


def test_a_bad_workflow_name_is_refused() -> None:
    with pytest.raises(ValueError, match="name"):
        Schedule.create("", "* * * * *")
    with pytest.raises(ValueError, match="not a @workflow"):
        Schedule.create(42, "* * * * *")


# --- the loop's plan ----------------------------------------------------------------------


def _due(sched: Schedule, behind: datetime) -> Schedule:
    """The schedule as the store holds it when its next run was due at ``behind``."""
    return Schedule.from_record(sched.definition(), paused=False,
                                next_run_at=behind.timestamp())


def test_plan_fires_a_due_occurrence_and_moves_past_now() -> None:
    sched = Schedule.create("r", every=60, schedule_id="s", created_at=utc(2026, 1, 1))
    now = utc(2026, 1, 1, 0, 1, 7).timestamp()
    decision = plan(sched, now)
    assert decision.occurrence == utc(2026, 1, 1, 0, 1).timestamp()
    assert decision.next_run_at == utc(2026, 1, 1, 0, 2).timestamp()
    assert decision.in_window
    assert decision.key == f"schedule:s:{int(utc(2026, 1, 1, 0, 1).timestamp())}"
    assert decision.key == idempotency_key("s", utc(2026, 1, 1, 0, 1))


def test_after_downtime_plan_fires_once_for_the_latest_missed_occurrence() -> None:
    sched = _due(cron("0 * * * *"), utc(2026, 1, 1, 1))
    now = utc(2026, 1, 3, 5, 20).timestamp()  # two days down
    decision = plan(sched, now)
    assert decision.occurrence == utc(2026, 1, 3, 5).timestamp()
    assert decision.next_run_at == utc(2026, 1, 3, 6).timestamp()
    assert decision.in_window


def test_catchup_window_fires_the_missed_occurrence_only_if_it_is_recent() -> None:
    base = Schedule.create("r", "0 * * * *", schedule_id="s", created_at=utc(2026, 1, 1),
                           catchup_window=timedelta(minutes=10))
    sched = _due(base, utc(2026, 1, 1, 1))
    assert plan(sched, utc(2026, 1, 1, 3, 10).timestamp()).in_window
    late = plan(sched, utc(2026, 1, 1, 3, 10, 1).timestamp())
    assert not late.in_window
    assert late.next_run_at == utc(2026, 1, 1, 4).timestamp()
