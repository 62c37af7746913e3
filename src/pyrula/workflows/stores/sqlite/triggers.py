"""Events and batch triggers in the SQLite store: ``emit`` appends to ``trigger_events``;
``take_batches`` routes the events a subscription has not seen to ``trigger_pending`` and
turns each due batch into a queued run, all in one transaction, so an event is taken by
exactly one run of each workflow however many processes race (see schema.py)."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Sequence
from typing import Any

from pyrula.workflows.records import RunHandle
from pyrula.workflows.stores.common import NO_OWNER, new_event_id
from pyrula.workflows.stores.sqlite.calls import Calls
from pyrula.workflows.stores.sqlite.connection import Database
from pyrula.workflows.stores.sqlite.rows import from_json, new_run, to_json
from pyrula.workflows.triggers import (
    batch_due,
    batch_key,
    batch_params,
    batch_run_id,
    event_item,
)

logger = logging.getLogger(__name__)


class EventTriggers:
    """emit and take_batches (Triggers)."""

    def __init__(self, db: Database, calls: Calls) -> None:
        self._db = db
        self._calls = calls

    async def emit(
        self, topic: str, payload: Any, *, now: float, key: str | None = None,
        owner: str | None = None,
    ) -> tuple[str, bool]:
        def op() -> tuple[str, bool]:
            with self._db.tx() as conn:
                if key is not None:
                    row = conn.execute(
                        "SELECT event_id FROM trigger_events WHERE topic=? AND key=?",
                        (topic, key),
                    ).fetchone()
                    if row is not None:
                        return str(row[0]), False
                event_id = new_event_id(now)
                conn.execute(
                    "INSERT INTO trigger_events(event_id, topic, key, owner, payload, "
                    "emitted_at) VALUES (?, ?, ?, ?, ?, ?)",
                    (event_id, topic, key, owner or NO_OWNER, to_json(payload), now),
                )
                return event_id, True

        return await self._calls.call(op, inline=True)

    async def take_batches(
        self, name: str, topic: str, *, max_size: int, max_wait: float, now: float,
        limit: int,
    ) -> list[RunHandle]:
        def op() -> list[RunHandle]:
            with self._db.tx() as conn:
                _route(conn, name, topic)
                started: list[RunHandle] = []
                for owner, count, first_at in _pending(conn, name, topic):
                    oldest: float | None = first_at
                    while len(started) < limit and batch_due(
                        count, oldest, max_size=max_size, max_wait=max_wait, now=now
                    ):
                        taken = _take(conn, name, topic, owner, max_size)
                        started.append(_start(conn, name, topic, owner, taken, now))
                        count -= len(taken)
                        oldest = _oldest(conn, name, topic, owner)
                return started

        return await self._calls.call(op)


def _route(conn: sqlite3.Connection, name: str, topic: str) -> None:
    """Subscribe ``name`` to ``topic`` if it is not yet (the topic's first subscription
    from the log's start, a later one from its end), then make the events it has not seen
    pending for it."""
    conn.execute(
        "INSERT OR IGNORE INTO trigger_subs(name, topic, routed) VALUES (?, ?, "
        "CASE WHEN EXISTS (SELECT 1 FROM trigger_subs WHERE topic=?) THEN "
        "(SELECT COALESCE(MAX(seq), 0) FROM trigger_events WHERE topic=?) ELSE 0 END)",
        (name, topic, topic, topic),
    )
    routed = conn.execute("SELECT routed FROM trigger_subs WHERE name=? AND topic=?",
                          (name, topic)).fetchone()[0]
    last = conn.execute(
        "INSERT INTO trigger_pending(name, topic, owner, seq) SELECT ?, topic, owner, seq "
        "FROM trigger_events WHERE topic=? AND seq>? ORDER BY seq RETURNING seq",
        (name, topic, routed),
    ).fetchall()
    if last:
        conn.execute("UPDATE trigger_subs SET routed=? WHERE name=? AND topic=?",
                     (max(r[0] for r in last), name, topic))


def _pending(conn: sqlite3.Connection, name: str, topic: str) -> list[tuple[str, int, float]]:
    """(owner, events pending, when its oldest pending event was emitted) per owner, the
    longest waiting first (ties by owner)."""
    rows = conn.execute(
        "SELECT p.owner, COUNT(*), e.emitted_at FROM trigger_pending p JOIN trigger_events e "
        "ON e.seq=(SELECT MIN(q.seq) FROM trigger_pending q WHERE q.name=p.name "
        "AND q.topic=p.topic AND q.owner=p.owner) WHERE p.name=? AND p.topic=? "
        "GROUP BY p.owner",
        (name, topic),
    ).fetchall()
    return sorted(((str(r[0]), int(r[1]), float(r[2])) for r in rows),
                  key=lambda row: (row[2], row[0]))


def _oldest(conn: sqlite3.Connection, name: str, topic: str, owner: str) -> float | None:
    row = conn.execute(
        "SELECT e.emitted_at FROM trigger_pending p JOIN trigger_events e ON e.seq=p.seq "
        "WHERE p.name=? AND p.topic=? AND p.owner=? ORDER BY p.seq LIMIT 1",
        (name, topic, owner),
    ).fetchone()
    return None if row is None else float(row[0])


def _take(conn: sqlite3.Connection, name: str, topic: str, owner: str,
          max_size: int) -> list[sqlite3.Row]:
    """The owner's oldest ``max_size`` pending events, no longer pending."""
    rows: list[sqlite3.Row] = conn.execute(
        "SELECT e.seq, e.event_id, e.key, e.payload, e.emitted_at FROM trigger_pending p "
        "JOIN trigger_events e ON e.seq=p.seq WHERE p.name=? AND p.topic=? AND p.owner=? "
        "ORDER BY p.seq LIMIT ?",
        (name, topic, owner, max_size),
    ).fetchall()
    conn.executemany(
        "DELETE FROM trigger_pending WHERE name=? AND topic=? AND owner=? AND seq=?",
        [(name, topic, owner, r[0]) for r in rows],
    )
    return rows


def _start(conn: sqlite3.Connection, name: str, topic: str, owner: str,
           taken: Sequence[sqlite3.Row], now: float) -> RunHandle:
    """Queue the run of the batch ``taken`` (or find the one queued already)."""
    first = str(taken[0][1])
    key = batch_key(topic, first)
    row = conn.execute("SELECT run_id FROM runs WHERE name=? AND idempotency_key=?",
                       (name, key)).fetchone()
    if row is not None:
        return RunHandle(name, str(row[0]))
    params = batch_params(topic, [
        event_item(str(r[1]), r[2], from_json(r[3]), float(r[4])) for r in taken
    ])
    run_id = new_run(conn, name, params, owner, now, key, None,
                     run_id=batch_run_id(name, topic, first))
    return RunHandle(name, run_id)
