"""A text log line starts with the instant in the one form every instant pyrula shows
takes, ISO-8601 UTC with milliseconds and ``Z``, whatever the host's time zone."""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Iterator

import pytest

from pyrula.logs import TextFormatter

ISO_HEAD = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z) ")


@pytest.fixture
def far_zone() -> Iterator[None]:
    """The process's local time 10 hours off UTC (a local-time clock would show it)."""
    before = os.environ.get("TZ")
    os.environ["TZ"] = "Pacific/Honolulu"
    time.tzset()
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TZ", None)
        else:
            os.environ["TZ"] = before
        time.tzset()


def record(created: float, message: str = "run_failed: boom") -> logging.LogRecord:
    made = logging.LogRecord("pyrula.workflows.worker", logging.WARNING, __file__, 1,
                             message, None, None)
    made.created = created
    made.msecs = (created - int(created)) * 1000
    return made


def test_a_text_line_opens_with_the_utc_instant(far_zone: None) -> None:
    line = TextFormatter().format(record(1796165901.1234))
    assert line == "2026-12-01T22:58:21.123Z WARNING pyrula.workflows.worker: run_failed: boom"


def test_a_childs_line_carries_its_slot_and_pid_after_the_instant(far_zone: None) -> None:
    line = TextFormatter({"slot": 2, "pid": 4242}).format(record(1796165901.5))
    head = ISO_HEAD.match(line)
    assert head is not None and head.group(1) == "2026-12-01T22:58:21.500Z", line
    assert line[head.end():] == ("WARNING [slot 2 pid 4242] pyrula.workflows.worker: "
                                 "run_failed: boom")
