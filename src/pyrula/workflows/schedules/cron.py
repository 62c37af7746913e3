"""Five-field cron expressions on naive wall-clock time. Pure: no clock, no time zone.

``CronExpr.parse`` validates and compiles an expression; ``walls_after`` and
``walls_at_or_before`` enumerate the wall times it matches. Mapping wall times onto
instants in a time zone (the DST rules) is ``schedule.py``'s business.

Syntax: ``minute hour day-of-month month day-of-week``; each field a comma list of ``*``,
``N``, ``N-M``, optionally ``/step`` (``N/step`` means ``N-max/step``); month and weekday
names (``jan``, ``mon-fri``); weekday 0 or 7 is Sunday; ``?`` is ``*`` in the day fields.
Macros: ``@yearly`` (``@annually``), ``@monthly``, ``@weekly``, ``@daily`` (``@midnight``),
``@hourly``. As in Vixie cron, when both day fields are restricted (neither starts with
``*`` or ``?``) a day matches if either does; otherwise both must.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from functools import lru_cache

MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
# Cron's names are English whatever the locale (``calendar.month_abbr`` follows it).
_MONTHS = {m: i for i, m in enumerate(("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug",
                                       "sep", "oct", "nov", "dec"), 1)}
_DAYS = {"sun": 0, "mon": 1, "tue": 2, "wed": 3, "thu": 4, "fri": 5, "sat": 6}
# (name, lowest, highest, names)
_FIELDS: tuple[tuple[str, int, int, dict[str, int]], ...] = (
    ("minute", 0, 59, {}),
    ("hour", 0, 23, {}),
    ("day-of-month", 1, 31, {}),
    ("month", 1, 12, _MONTHS),
    ("day-of-week", 0, 7, _DAYS),
)
#: Longest a day may be (February in a leap year), for the "never fires" check.
_MONTH_DAYS = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


class CronError(ValueError):
    """An expression that is not a valid five-field cron expression."""


@dataclass(frozen=True, slots=True)
class CronExpr:
    """A compiled cron expression: the values each field matches."""

    text: str
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday
    days_restricted: bool
    weekdays_restricted: bool

    @staticmethod
    def parse(text: str) -> CronExpr:
        return _parse(text)

    def matches_day(self, day: date) -> bool:
        if day.month not in self.months:
            return False
        in_days = day.day in self.days
        in_weekdays = (day.weekday() + 1) % 7 in self.weekdays
        if self.days_restricted and self.weekdays_restricted:
            return in_days or in_weekdays
        return in_days and in_weekdays

    def walls_after(self, start: datetime) -> Iterator[datetime]:
        """Matching naive wall times strictly after ``start``, ascending (endless)."""
        day = start.date()
        while True:
            if day.month not in self.months:
                day = _first_of_next_month(day)
                continue
            if self.matches_day(day):
                for hour in self.hours:
                    for minute in self.minutes:
                        wall = datetime.combine(day, time(hour, minute))
                        if wall > start:
                            yield wall
            day += timedelta(days=1)

    def walls_at_or_before(self, start: datetime) -> Iterator[datetime]:
        """Matching naive wall times at or before ``start``, descending (until year 1)."""
        day = start.date()
        while True:
            if day.month not in self.months:
                day = day.replace(day=1) - timedelta(days=1)
                continue
            if self.matches_day(day):
                for hour in reversed(self.hours):
                    for minute in reversed(self.minutes):
                        wall = datetime.combine(day, time(hour, minute))
                        if wall <= start:
                            yield wall
            if day == date.min:
                return
            day -= timedelta(days=1)


def _first_of_next_month(day: date) -> date:
    return (day.replace(day=28) + timedelta(days=4)).replace(day=1)


@lru_cache(maxsize=512)
def _parse(text: str) -> CronExpr:
    return _compile(text)


# Apart from its cache: a mutation tester leaves decorated functions alone (docs/mutation.md).
def _compile(text: str) -> CronExpr:
    if not isinstance(text, str):
        raise CronError(f"cron expression must be a str, got {type(text).__name__}")
    expr = " ".join(text.split())
    if not expr:
        raise CronError("invalid cron expression '': it is empty")
    if expr.startswith("@"):
        macro = MACROS.get(expr.lower())
        if macro is None:
            raise CronError(
                f"invalid cron expression {text!r}: unknown macro {expr!r} "
                f"(supported: {', '.join(MACROS)})"
            )
        expr = macro
    fields = expr.split(" ")
    if len(fields) != 5:
        raise CronError(
            f"invalid cron expression {text!r}: it has {len(fields)} fields, "
            "cron needs 5 (minute hour day-of-month month day-of-week)"
        )
    values = [_field(text, raw, *spec) for raw, spec in zip(fields, _FIELDS, strict=True)]
    weekdays = frozenset(0 if d == 7 else d for d in values[4])
    parsed = CronExpr(
        text=text,
        minutes=tuple(sorted(values[0])),
        hours=tuple(sorted(values[1])),
        days=frozenset(values[2]),
        months=frozenset(values[3]),
        weekdays=weekdays,
        days_restricted=not fields[2].startswith(("*", "?")),
        weekdays_restricted=not fields[4].startswith(("*", "?")),
    )
    if parsed.days_restricted and not parsed.weekdays_restricted and not any(
        d <= _MONTH_DAYS[m - 1] for m in parsed.months for d in parsed.days
    ):
        raise CronError(
            f"invalid cron expression {text!r}: it never fires (no month it names has "
            "such a day)"
        )
    return parsed


def _field(text: str, raw: str, name: str, low: int, high: int, names: dict[str, int]) -> set[int]:
    def bad(why: str) -> CronError:
        return CronError(f"invalid cron expression {text!r}: {name} field {raw!r} {why}")

    def number(token: str) -> int:
        token = token.lower()
        if token in names:
            return names[token]
        if not (token.isascii() and token.isdigit()):
            if "#" in token or token.endswith(("l", "w")):  # L, W, 15W, 5L, 1#2
                raise bad(f"uses {token!r}, which is not supported")
            raise bad(f"has {token!r}, which is not a number" + (
                f" or a name ({', '.join(names)})" if names else ""))
        value = int(token)
        if not low <= value <= high:
            raise bad(f"has {value}, outside {low}-{high}")
        return value

    out: set[int] = set()
    for item in raw.split(","):
        if not item:
            raise bad("has an empty list item")
        base, slash, step_text = item.partition("/")
        step = 1
        if slash:
            if not (step_text.isascii() and step_text.isdigit()) or int(step_text) < 1:
                raise bad(f"has step {step_text!r}; a step must be a whole number >= 1")
            step = int(step_text)
        if base in ("*", "?"):
            if base == "?" and name not in ("day-of-month", "day-of-week"):
                raise bad("uses '?', which only the day fields accept")
            first, last = low, high
        elif "-" in base:
            start_text, _, end_text = base.partition("-")
            first, last = number(start_text), number(end_text)
            if first > last:
                raise bad(f"has the range {base!r}, which runs backwards")
        else:
            first = number(base)
            last = high if slash else first
        out.update(range(first, last + 1, step))
    return out
