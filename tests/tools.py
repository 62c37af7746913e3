"""Tests that need a tool of the machine (chromium, libfaketime, openssl, PostgreSQL, ...).

Where the tool is missing, :func:`needs_tool` skips the test on a laptop, naming the area
that goes untested and why, and the session ends with one line listing every such area
(``pytest_terminal_summary`` in ``tests/conftest.py``). Under ``CI=true`` it fails the test
instead: CI installs every tool (``make system-deps``), so a missing one there is a broken
setup, not a reason to pass with a whole area unseen.

Skips for other reasons (behaviour specific to one Python version or platform, an
illustration that is not meant to run) stay ordinary skips.

``make test`` collects the areas its runs skipped in the file ``$PYRULA_SKIPPED_AREAS``
(the newer Pythons' runs and a missing interpreter add theirs) and prints them in one line
at its end: ``python -m tests.tools FILE``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest

#: The prefix of a skip's reason that says a tool is missing: "needs tool: AREA: WHY".
PREFIX = "needs tool: "
#: Where ``make test`` collects the skipped areas of its runs (one "AREA: WHY" a line).
AREAS_FILE = "PYRULA_SKIPPED_AREAS"


def in_ci() -> bool:
    return os.environ.get("CI") == "true"


def needs_tool(area: str, missing: str | None) -> None:
    """Skip the test (under ``CI=true``: fail it) when ``missing`` says what is missing;
    ``area`` names what then goes untested, e.g. ``"chromium (dashboard browser tests)"``.
    Does nothing when ``missing`` is None."""
    if missing is None:
        return
    if in_ci():
        pytest.fail(f"{area}: {missing} (CI=true: a missing tool fails the test, "
                    "it does not skip it)", pytrace=False)
    pytest.skip(f"{PREFIX}{area}: {missing}")


def area_of(reason: str) -> tuple[str, str] | None:
    """(area, why) of a skip reason :func:`needs_tool` wrote, else None."""
    reason = reason.removeprefix("Skipped: ")
    if not reason.startswith(PREFIX):
        return None
    area, _, why = reason[len(PREFIX):].partition(": ")
    return area, why


def summary(areas: Iterable[tuple[str, str]]) -> str:
    """One line: every skipped area once (the first reason given for it), in order."""
    seen: dict[str, str] = {}
    for area, why in areas:
        seen.setdefault(area, why)
    if not seen:
        return "skipped areas: none"
    return "skipped areas: " + "; ".join(f"{area}: {why}" for area, why in seen.items())


def record(areas: Iterable[tuple[str, str]]) -> bool:
    """Append ``areas`` to ``$PYRULA_SKIPPED_AREAS``; False when that is not set."""
    path = os.environ.get(AREAS_FILE)
    if not path:
        return False
    with open(path, "a") as out:
        out.writelines(f"{area}: {why}\n" for area, why in areas)
    return True


def main(argv: list[str]) -> int:
    """``python -m tests.tools FILE``: print the one line of the areas collected in FILE."""
    path = Path(argv[1])
    areas = []
    for line in path.read_text().splitlines() if path.exists() else ():
        area, _, why = line.partition(": ")
        areas.append((area, why))
    print(summary(areas))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
