"""How the fleet reports its children's boot: each failure in one line, a distinct error's
traceback once, and the fleet ready once every child it started is.

Children that fail to boot usually fail the same way (an app that raises at import fails in
every child): the first child's error is logged with its traceback, the next ones that say
the same in one line each, so the crash-loop summary that follows is not buried under copies.
"""

from __future__ import annotations

import logging
from typing import Any

from pyrula.logs import FLEET_LOGGER

logger = logging.getLogger(FLEET_LOGGER)  # printed on every line: see pyrula.logs


class BootReport:
    """What the supervisor has said about boots so far."""

    def __init__(self) -> None:
        self._seen: set[str] = set()
        self._ready_logged = False

    def failed(self, slot: int, pid: int, message: dict[str, Any]) -> str:
        """Log a child's ``boot_error`` message; returns its one-line error."""
        error = str(message.get("message", "")) or "no reason given"
        detail = str(message.get("traceback", "") or "")
        extra = {"event": "child_boot_failed", "slot": slot, "pid": pid}
        if error in self._seen or not detail:
            again = " (the same error as before)" if error in self._seen else ""
            logger.error("child_boot_failed: %s; slot %d pid %d%s", error, slot, pid, again,
                         extra=extra)
        else:
            logger.error("child_boot_failed: %s; slot %d pid %d\n%s", error, slot, pid, detail,
                         extra=extra)
        self._seen.add(error)
        return error

    def ready(self, ready: int, desired: int, since_start: float) -> None:
        """Log ``fleet_ready`` the first time ``desired`` children are ready."""
        if self._ready_logged or ready < desired:
            return
        self._ready_logged = True
        logger.info("fleet_ready: %d of %d children ready in %.0f ms", ready, desired,
                    since_start * 1000,
                    extra={"event": "fleet_ready", "children": ready})
