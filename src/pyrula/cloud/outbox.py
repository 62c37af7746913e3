"""The connector's spool: critical events that could not be delivered, kept on disk.

Each connector appends to a file of its own, ``<host>-<pid>-<nonce>.jsonl`` in the
outbox directory, when a send fails or its drain deadline passes. On start it takes the
files of processes that are gone (same host, pid not alive; another host's after a day):
it copies their events into its own file first, then deletes them, so a crash between the
two only means a resend, which the collector applies once. Its own file is emptied
whenever everything in it has been delivered.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from pathlib import Path
from typing import Any

import orjson
import psutil

logger = logging.getLogger(__name__)

#: How old another host's spool file must be before it is taken (its owner cannot be asked).
FOREIGN_AGE_S = 24 * 3600.0
_SUFFIX = ".jsonl"


class Outbox:
    """One connector's spool file in ``directory`` (created if missing)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._host = socket.gethostname().replace("-", "_")
        name = f"{self._host}-{os.getpid()}-{os.urandom(4).hex()}{_SUFFIX}"
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / name

    def append(self, events: list[dict[str, Any]]) -> None:
        """Write ``events`` durably (flushed and fsynced) to this connector's file."""
        if not events:
            return
        data = b"".join(orjson.dumps(e) + b"\n" for e in events)
        with open(self.path, "ab") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())

    def clear(self) -> None:
        """Everything spooled here was delivered."""
        self.path.unlink(missing_ok=True)

    def take_leftovers(self) -> list[dict[str, Any]]:
        """The events of spool files whose owner is gone, moved into this file."""
        taken: list[dict[str, Any]] = []
        files = [p for p in self.directory.glob(f"*{_SUFFIX}")
                 if p != self.path and self._orphaned(p)]
        for path in files:
            taken += _read(path)
        self.append(taken)
        for path in files:
            path.unlink(missing_ok=True)
        return taken

    def _orphaned(self, path: Path) -> bool:
        host, _, rest = path.name.partition("-")
        pid_text = rest.partition("-")[0]
        if host != self._host:
            try:
                return time.time() - path.stat().st_mtime > FOREIGN_AGE_S
            except OSError:
                return False
        try:
            pid = int(pid_text)
        except ValueError:
            return False
        return pid != os.getpid() and not psutil.pid_exists(pid)


def _read(path: Path) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    try:
        lines = path.read_bytes().splitlines()
    except OSError:
        return events
    for line in lines:
        try:
            events.append(orjson.loads(line))
        except orjson.JSONDecodeError:  # a line cut short by a crash mid-write
            logger.warning("cloud outbox: skipped a damaged line in %s", path)
    return events
