"""Per-key concurrency limits and start rates in the SQLite store (KeyedLimits), with the
memory store's semantics (stores/memory/limits.py), inside the claim's transaction.

A queued run with keys waits in its key's line: ``limit_line`` set, ``queue_seq`` NULL (so
the owners' queues never read it), ``limit_seq`` its place (``runs_held`` index). Each
claim of a name this process has limits for first admits the heads of its lines whose key
has a free slot and a rate token into their owners' queues (``admit``). A run holds its
key's slot while it is running or admitted (queued with a ``queue_seq``), counted from the
runs themselves (``runs_slots`` index), so every way a run stops running frees its slot.
Rate buckets live in ``limit_buckets``, shared by every process on the file. A claim of a
name without limits reads nothing more than before.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence

from pyrula.workflows.events import EventType, make_event
from pyrula.workflows.limits import LimitKeys, WorkflowLimits
from pyrula.workflows.stores.common import TokenBucket
from pyrula.workflows.stores.sqlite.calls import Calls
from pyrula.workflows.stores.sqlite.connection import Database
from pyrula.workflows.stores.sqlite.rows import (
    admit,
    append_events,
    enqueue,
    enqueue_suspect,
    fenced_run,
)

#: The lines of a name with waiting runs: a skip scan of the runs_held index.
_LINES = (
    "WITH RECURSIVE l(line) AS ("
    "SELECT (SELECT MIN(limit_line) FROM runs WHERE name=:name AND status='queued' "
    "AND limit_line IS NOT NULL) "
    "UNION ALL SELECT (SELECT MIN(limit_line) FROM runs WHERE name=:name AND status='queued' "
    "AND limit_line IS NOT NULL AND limit_line>l.line) FROM l WHERE l.line IS NOT NULL) "
    "SELECT line FROM l WHERE line IS NOT NULL"
)
_HEAD = (
    "SELECT run_id, owner, limit_conc, limit_rate FROM runs WHERE name=? AND status='queued' "
    "AND limit_line=? ORDER BY limit_seq LIMIT 1"
)
#: Runs of a concurrency key holding a slot: running, or admitted to their owner's queue.
_SLOTS = (
    "SELECT COUNT(*) FROM runs WHERE name=? AND limit_conc=? AND (status='running' "
    "OR (status='queued' AND queue_seq IS NOT NULL))"
)


def held_line(keys: LimitKeys) -> str | None:
    """The line a queued run with ``keys`` waits in (as ``enqueue`` computes it)."""
    if keys.concurrency is not None:
        return "c:" + keys.concurrency
    if keys.rate is not None:
        return "r:" + keys.rate
    return None


class SQLiteLimits:
    """The limits this process's workers registered (``use_limits``)."""

    def __init__(self, db: Database, calls: Calls) -> None:
        self._db = db
        self._calls = calls
        self.limits: dict[str, WorkflowLimits] = {}

    def use_limits(self, limits: Mapping[str, WorkflowLimits]) -> None:
        """Enforce ``limits`` (workflow name -> its limits) from the next claim on."""
        self.limits.update(limits)

    def admit(self, conn: sqlite3.Connection, names: Sequence[str], now: float) -> None:
        """Move the runs of ``names`` that their limits let start now out of their keys'
        lines into their owners' queues, each line in FIFO order until its head must
        wait. Names without limits here are not read at all."""
        for name in names:
            if name not in self.limits:
                continue
            for (line,) in conn.execute(_LINES, {"name": name}).fetchall():
                while True:
                    head = conn.execute(_HEAD, (name, line)).fetchone()
                    if head is None:
                        break
                    run_id, owner, conc, rate = head
                    if not self.room(conn, name, conc, rate, now):
                        break
                    admit(conn, run_id, name, owner)

    def room(
        self, conn: sqlite3.Connection, name: str, conc: str | None, rate: str | None,
        now: float, *, held_by_run: bool = False,
    ) -> bool:
        """Whether a run of ``name`` with these keys may start now, taking a rate token if
        so. ``held_by_run``: the run already counts among its key's (it is running)."""
        limits = self.limits.get(name)
        if limits is None or (conc is None and rate is None):
            return True
        if conc is not None and limits.max is not None:
            used = int(conn.execute(_SLOTS, (name, conc)).fetchone()[0])
            if used - (1 if held_by_run else 0) >= limits.max:
                return False
        if rate is not None and limits.per_second is not None:
            row = conn.execute(
                "SELECT tokens, stamp FROM limit_buckets WHERE name=? AND key=?", (name, rate)
            ).fetchone()
            bucket = TokenBucket(1.0, now) if row is None else TokenBucket(row[0], row[1])
            took = bucket.take(limits.per_second, now)
            conn.execute(
                "INSERT INTO limit_buckets(name, key, tokens, stamp) VALUES (?, ?, ?, ?) "
                "ON CONFLICT(name, key) DO UPDATE SET tokens=excluded.tokens, "
                "stamp=excluded.stamp",
                (name, rate, bucket.tokens, bucket.stamp),
            )
            return took
        return True

    async def assign_limit_keys(
        self, run_id: str, token: int, keys: LimitKeys, *, now: float
    ) -> bool:
        """Record the keys the worker computed for the run it claimed without them; True
        if its limits let it run, else it goes back to its key's line (``run:requeued``
        reason ``limit``, lock released) and False. One transaction, fenced."""

        def op() -> bool:
            with self._db.tx() as conn:
                row = fenced_run(conn, run_id, token)
                name = row["name"]
                conn.execute(
                    "UPDATE runs SET limit_conc=?, limit_rate=? WHERE run_id=?",
                    (keys.concurrency, keys.rate, run_id),
                )
                line = held_line(keys)
                if line is None:
                    return True
                # FIFO: runs already waiting in its key's line go first.
                waiting = conn.execute(
                    "SELECT 1 FROM runs WHERE name=? AND status='queued' AND limit_line=? "
                    "LIMIT 1", (name, line)).fetchone()
                if waiting is None and self.room(
                    conn, name, keys.concurrency, keys.rate, now, held_by_run=True
                ):
                    return True
                requeued = make_event(EventType.RUN_REQUEUED, now, reason="limit")
                append_events(conn, run_id, row["journal_len"], [requeued], now)
                if row["suspect_seq"] is not None:
                    enqueue_suspect(conn, run_id, now)  # as the memory store's enqueue
                else:
                    enqueue(conn, run_id, name, row["owner"], now)
                return False

        return await self._calls.call(op, inline=True)
