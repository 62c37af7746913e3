"""What a bench run's result must be, and how it differs when it is not.

The built-in workflow returns ``x + steps`` for each run's own ``x``; a workflow of the
user's (``--workflow``) returns whatever it returns, or, with ``--expect``, one JSON value
every run must equal. A ``Check`` answers None for a right result, else the difference
in a few words (``$.items[2]: got "b", want "c"``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: A run's input (its ``x``) and result -> None when right, else the difference.
Check = Callable[[int, Any], str | None]

#: Longest a value is shown in a difference.
SHOWN = 60


@dataclass(frozen=True, slots=True)
class Expected:
    """The ``--expect`` value (a class of its own: JSON ``null`` is a value to expect)."""

    value: Any


def sum_check(steps: int) -> Check:
    """The built-in workflow's check: a run submitted with ``x`` returns ``x + steps``."""
    def check(x: int, result: Any) -> str | None:
        want = x + steps
        return None if _same(result, want) else f"got {_show(result)}, want {want}"

    return check


def expect_check(expected: Expected | None) -> Check:
    """A user's workflow's check: any result without ``--expect``, else that value."""
    def check(_x: int, result: Any) -> str | None:
        return None if expected is None else difference(result, expected.value)

    return check


def difference(got: Any, want: Any, path: str = "$") -> str | None:
    """The first place where the JSON values ``got`` and ``want`` differ (object keys in
    order, then list items), or None when they are equal. ``true`` is not ``1``, and a
    number equals one of the same value whether int or float (JSON does not tell them
    apart)."""
    if isinstance(want, dict) and isinstance(got, dict):
        for key in want:
            if key not in got:
                return f"{path}: missing key {_show(key)}"
            found = difference(got[key], want[key], f"{path}.{key}")
            if found:
                return found
        extra = [key for key in got if key not in want]
        return f"{path}: unexpected key {_show(extra[0])}" if extra else None
    if isinstance(want, list) and isinstance(got, list):
        for index, (item, wanted) in enumerate(zip(got, want, strict=False)):
            found = difference(item, wanted, f"{path}[{index}]")
            if found:
                return found
        if len(got) != len(want):
            return f"{path}: {len(got)} items, want {len(want)}"
        return None
    return None if _same(got, want) else f"{path}: got {_show(got)}, want {_show(want)}"


def _same(got: Any, want: Any) -> bool:
    """Equal scalars of the same JSON type (Python's ``True == 1`` is not JSON's)."""
    if isinstance(got, bool) or isinstance(want, bool):
        return type(got) is type(want) and got == want
    if isinstance(got, int | float) and isinstance(want, int | float):
        return got == want
    return type(got) is type(want) and got == want


def _show(value: Any) -> str:
    """``value`` as JSON (what the user wrote ``--expect`` in), cut to ``SHOWN``."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= SHOWN else text[:SHOWN - 3] + "..."
