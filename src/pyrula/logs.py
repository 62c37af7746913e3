"""Logging setup for the entry points: one line per event, JSON or text.

Library code only calls ``logging.getLogger(__name__)``; the CLI and the fleet call
``configure``. The supervisor's modules and the CLI's signal handling log under the two
names below instead of their module paths: a logger's name is printed in every line (the
JSON ``logger`` field, the text format's ``name:``), so those names are part of the output
operators filter on. An event's name travels in ``extra={"event": ...}`` together with its
context (worker_id, run_id, workflow...).
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
from collections.abc import Mapping
from typing import Any

from pyrula.timestamps import iso_utc

#: The logger of the fleet's supervisor (``pyrula.supervisor.*``).
FLEET_LOGGER = "pyrula.fleet"
#: The logger of the CLI's own messages (``pyrula.cli.common``).
CLI_LOGGER = "pyrula.cli"

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}

#: The run whose code runs in this context (``run_id``, ``workflow``, ``attempt``, and
#: ``step`` inside a step), set by the engine for a workflow's body and each step, so that
#: a line the app logs there says which run wrote it.
RUN_FIELDS: contextvars.ContextVar[Mapping[str, Any] | None] = contextvars.ContextVar(
    "pyrula_run_fields", default=None
)
#: The worker whose tasks run in this context (``worker_id``), set by the worker.
WORKER_FIELDS: contextvars.ContextVar[Mapping[str, Any] | None] = contextvars.ContextVar(
    "pyrula_worker_fields", default=None
)


class ContextFields(logging.Filter):
    """Give each record the run and worker fields of the context it was logged in, where
    the call did not pass them itself: a JSON line then names the ``run_id``, ``workflow``,
    ``attempt`` and ``worker_id`` wherever they are known, the app's own lines included.
    ``process`` fields (a fleet child's ``slot`` and ``pid``) go on every record.
    Installed by ``configure``; an app with its own logging setup can add it to a handler.
    """

    def __init__(self, process: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self.process = dict(process or {})

    def filter(self, record: logging.LogRecord) -> bool:
        for fields in (RUN_FIELDS.get(), WORKER_FIELDS.get(), self.process):
            if fields:
                for key, value in fields.items():
                    if not hasattr(record, key):
                        setattr(record, key, value)
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "ts": iso_utc(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": getattr(record, "event", None) or _event_of(record.getMessage()),
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in data:
                data[key] = value
        if record.exc_info:
            data["exception"] = self.formatException(record.exc_info)
        return json.dumps(data, default=str)


class TextFormatter(logging.Formatter):
    """``2026-12-01T12:00:00.123Z INFO    name: message``; with ``process`` fields (a fleet
    child's), ``2026-12-01T12:00:00.123Z INFO    [slot 1 pid 1234] name: message``, so that
    the lines of the fleet's children, which share its stderr, say which child wrote them.
    The time is the one form every instant pyrula shows takes (ISO-8601 UTC), never the
    host's local time: lines from hosts in other zones, or a JSON log, line up."""

    def __init__(self, process: Mapping[str, Any] | None = None) -> None:
        tag = " ".join(f"{key} {value}" for key, value in (process or {}).items())
        tag = f"[{tag}] " if tag else ""
        super().__init__(f"%(asctime)s %(levelname)-7s {tag.replace('%', '%%')}"
                         "%(name)s: %(message)s")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802
        return iso_utc(record.created)


def _event_of(message: str) -> str:
    head = message.split(":", 1)[0]
    return head if head and " " not in head else ""


_format = "text"


def announce(text: str, event: str, **fields: Any) -> None:
    """Print a command's banner line to stderr: as it is for people, or as one JSON log
    line (``event``, with ``fields``) under ``--log-format json``, so that every line a
    JSON-logging process writes parses."""
    if _format == "json":
        logging.getLogger(CLI_LOGGER).info(text, extra={"event": event, **fields})
    else:
        print(text, file=sys.stderr, flush=True)


def configure(fmt: str = "text", level: str | int = "INFO",
              process: Mapping[str, Any] | None = None) -> None:
    """Send pyrula's logs (and the app's) to stderr, one line per event. ``process``
    names the process on every line (a fleet child passes its ``slot`` and ``pid``): JSON
    fields, or a ``[slot 1 pid 1234]`` tag before the logger's name in text."""
    global _format
    if fmt not in ("text", "json"):
        from pyrula.errors import ConfigurationError

        raise ConfigurationError(f"log format must be json or text, got {fmt!r}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter(process))
    handler.addFilter(ContextFields(process))
    _format = fmt
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    try:
        root.setLevel(level.upper() if isinstance(level, str) else level)
    except ValueError:
        from pyrula.errors import ConfigurationError

        raise ConfigurationError(f"unknown log level {level!r}") from None
