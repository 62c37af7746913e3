"""The SQLite store's row helpers, shared by its parts: reading a run's row (fenced or
not), appending to its journal, queueing it, ending it. Each takes the connection of the
transaction it runs in and does no transaction control of its own."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Sequence
from typing import Any

import orjson

from pyrula.workflows.errors import StaleToken, WorkflowNotFound
from pyrula.workflows.events import Event
from pyrula.workflows.limits import LimitKeys
from pyrula.workflows.records import TERMINAL_STATUSES, RunInfo, RunStatus
from pyrula.workflows.stores.common import journal_entry, new_run_id, submitted_event

logger = logging.getLogger(__name__)

RUN_COLUMNS = (
    "run_id, name, owner, params, status, attempt, created_at, updated_at, started_at, "
    "finished_at, result, error, wake_at, waiting_for, interrupt, idempotency_key, start_id, "
    "successor_id, cancel_requested, crashes, lock_owner, lock_expires, journal_len, signal_seq, "
    "parked_seq, suspect_seq, priority, nudged"
)

#: The terminal statuses, as an SQL list (``status IN (...)``).
TERMINAL = ", ".join(f"'{s.value}'" for s in sorted(TERMINAL_STATUSES))


def to_json(value: Any) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS)


def from_json(data: bytes | str | None) -> Any:
    return None if data is None else orjson.loads(data)


def run_row(conn: sqlite3.Connection, run_id: str) -> sqlite3.Row | None:
    found: sqlite3.Row | None = conn.execute(
        f"SELECT {RUN_COLUMNS} FROM runs WHERE run_id=?", (run_id,)
    ).fetchone()
    return found


def require_run(conn: sqlite3.Connection, run_id: str) -> sqlite3.Row:
    found = run_row(conn, run_id)
    if found is None:
        raise WorkflowNotFound(f"no run with id {run_id!r}")
    return found


def fenced_run(conn: sqlite3.Connection, run_id: str, token: int) -> sqlite3.Row:
    found = require_run(conn, run_id)
    if found["status"] != RunStatus.RUNNING or found["attempt"] != token:
        raise StaleToken(run_id, token, found["attempt"])
    return found


def fenced_update(
    conn: sqlite3.Connection, run_id: str, token: int, assignments: str,
    args: Sequence[Any], returning: str,
) -> sqlite3.Row:
    """``UPDATE runs SET assignments`` if this attempt holds the run (the fence and the
    write in one statement); returns the ``returning`` columns, or raises StaleToken
    (or WorkflowNotFound) and changes nothing."""
    updated: sqlite3.Row | None = conn.execute(
        f"UPDATE runs SET {assignments} WHERE run_id=? AND status='running' AND attempt=? "
        f"RETURNING {returning}",
        (*args, run_id, token),
    ).fetchone()
    if updated is None:
        fenced_run(conn, run_id, token)  # raises: the run is unknown or not ours
        raise AssertionError("unreachable: the fenced update matched no row")
    return updated


def run_info(found: sqlite3.Row) -> RunInfo:
    return RunInfo(
        run_id=found["run_id"],
        name=found["name"],
        status=RunStatus(found["status"]),
        attempt=found["attempt"],
        params=from_json(found["params"]),
        owner=found["owner"] or None,
        created_at=found["created_at"],
        updated_at=found["updated_at"],
        started_at=found["started_at"],
        finished_at=found["finished_at"],
        result=from_json(found["result"]),
        error=from_json(found["error"]),
        wake_at=found["wake_at"],
        waiting_for=tuple(from_json(found["waiting_for"]) or ()),
        interrupt=from_json(found["interrupt"]),
        idempotency_key=found["idempotency_key"],
        start_id=found["start_id"],
        successor_id=found["successor_id"],
        priority=found["priority"],
    )


def insert_events(
    conn: sqlite3.Connection, run_id: str, length: int, events: Sequence[Event]
) -> int:
    """Insert ``events`` after seq ``length`` (the caller moves ``journal_len``)."""
    rows = []
    for event in events:
        length += 1
        stored = dict(event)
        stored["seq"] = length
        rows.append((run_id, length, to_json(stored)))
    if len(rows) == 1:
        conn.execute("INSERT INTO events(run_id, seq, data) VALUES (?, ?, ?)", rows[0])
    elif rows:
        conn.executemany("INSERT INTO events(run_id, seq, data) VALUES (?, ?, ?)", rows)
    return length


def append_events(
    conn: sqlite3.Connection, run_id: str, length: int, events: Sequence[Event], now: float
) -> int:
    """Journal ``events`` after seq ``length`` and move ``journal_len``; the new length."""
    length = insert_events(conn, run_id, length, events)
    conn.execute(
        "UPDATE runs SET journal_len=?, updated_at=? WHERE run_id=?", (length, now, run_id)
    )
    return length


def read_journal(conn: sqlite3.Connection, run_id: str, after: int = 0) -> list[Event]:
    """The run's events after seq ``after``; JournalCorrupt for a row that is not one."""
    rows = conn.execute(
        "SELECT seq, data FROM events WHERE run_id=? AND seq>? ORDER BY seq", (run_id, after)
    ).fetchall()
    return [journal_entry(run_id, seq, data) for seq, data in rows]


def _next_queue_seq(conn: sqlite3.Connection) -> int:
    found = conn.execute(
        "UPDATE meta SET value=CAST(value AS INTEGER)+1 WHERE key='queue_seq' RETURNING value"
    ).fetchone()
    if found is None:
        conn.execute("INSERT INTO meta(key, value) VALUES ('queue_seq', '1')")
        return 1
    return int(found[0])


def enqueue(conn: sqlite3.Connection, run_id: str, name: str, owner: str, now: float) -> None:
    """Queue the run last in its name's queue (its owner's served count kept fair),
    claimable from ``now``; or, a run with limit keys, last in its key's waiting line
    (``limit_line``, the memory store's ``held_line``), which a claim admits from."""
    # One UPDATE either way: a run without keys costs what it did before limits.
    seq = _next_queue_seq(conn)
    held = conn.execute(
        "UPDATE runs SET status='queued', limit_line=CASE WHEN limit_conc IS NOT NULL "
        "THEN 'c:'||limit_conc WHEN limit_rate IS NOT NULL THEN 'r:'||limit_rate END, "
        "queue_seq=CASE WHEN limit_conc IS NULL AND limit_rate IS NULL THEN :seq END, "
        "limit_seq=CASE WHEN limit_conc IS NULL AND limit_rate IS NULL THEN NULL "
        "ELSE :seq END, queued_at=:now, lock_owner=NULL, wake_at=NULL, waiting_for=NULL, "
        "interrupt=NULL WHERE run_id=:run_id RETURNING limit_line",
        {"seq": seq, "now": now, "run_id": run_id},
    ).fetchone()
    if held is None or held[0] is None:
        _level_owner(conn, run_id, name, owner)


def admit(conn: sqlite3.Connection, run_id: str, name: str, owner: str) -> None:
    """Move a run waiting in its key's line into its owner's queue, last."""
    conn.execute(
        "UPDATE runs SET queue_seq=?, limit_line=NULL, limit_seq=NULL WHERE run_id=?",
        (_next_queue_seq(conn), run_id),
    )
    _level_owner(conn, run_id, name, owner)


def _level_owner(conn: sqlite3.Connection, run_id: str, name: str, owner: str) -> None:
    """Level the served count of ``owner``, whose run ``run_id`` just joined its queue."""
    # The run itself is left out of the check.
    active = conn.execute(
        "SELECT 1 FROM runs WHERE name=? AND owner=? AND status='queued' AND run_id!=? "
        "AND queue_seq IS NOT NULL LIMIT 1",
        (name, owner, run_id),
    ).fetchone()
    if active is None:
        # A tenant that (re)appears starts level with the least-served active one,
        # not behind its own past (as the memory store's MemoryState.enqueue).
        floor = conn.execute(
            "SELECT MIN(s.served) FROM served s WHERE s.name=? AND s.owner!=? AND EXISTS "
            "(SELECT 1 FROM runs r WHERE r.name=s.name AND r.owner=s.owner "
            "AND r.status='queued' AND r.queue_seq IS NOT NULL)",
            (name, owner),
        ).fetchone()[0]
        conn.execute(
            "INSERT INTO served(name, owner, served) VALUES (?, ?, ?) ON CONFLICT(name, owner)"
            " DO UPDATE SET served=excluded.served",
            (name, owner, floor or 0.0),
        )


def enqueue_suspect(conn: sqlite3.Connection, run_id: str, now: float) -> None:
    """Queue the run (a suspect) apart from its owner's queue: last among the suspects of
    its name, which only ``claim_suspect`` (or a claim by id) takes. Its queue_seq stays
    NULL, so an ordinary claim never reads it."""
    conn.execute(
        "UPDATE runs SET status='queued', queue_seq=NULL, suspect_seq=?, queued_at=?, "
        "lock_owner=NULL, wake_at=NULL, waiting_for=NULL, interrupt=NULL WHERE run_id=?",
        (_next_queue_seq(conn), now, run_id),
    )


def new_run(
    conn: sqlite3.Connection, name: str, params: Any, owner: str, now: float,
    idempotency_key: str | None, start_id: str | None, predecessor: str | None = None,
    run_id: str | None = None, priority: int = 0, limit_keys: LimitKeys | None = None,
) -> str:
    """Insert a run (``run_id``, else a new id), journal its ``run:submitted`` and queue
    it (by ``priority`` among its owner's runs: the runs_queue_p index); its id."""
    run_id = run_id or new_run_id(now)
    conn.execute(
        "INSERT INTO runs(run_id, name, owner, params, status, attempt, created_at, "
        "updated_at, idempotency_key, start_id, journal_len, crashes, signal_seq, priority, "
        "limit_conc, limit_rate) VALUES (?, ?, ?, ?, 'queued', 0, ?, ?, ?, ?, 0, '[]', '{}', "
        "?, ?, ?)",
        (run_id, name, owner, to_json(params), now, now, idempotency_key, start_id or run_id,
         priority, None if limit_keys is None else limit_keys.concurrency,
         None if limit_keys is None else limit_keys.rate),
    )
    event = submitted_event(now, name, params, owner or None, idempotency_key)
    if predecessor is not None:
        event["predecessor"] = predecessor
    append_events(conn, run_id, 0, [event], now)
    enqueue(conn, run_id, name, owner, now)
    return run_id


def end_run(
    conn: sqlite3.Connection, run_id: str, status: RunStatus, now: float,
    result: Any = None, error: dict[str, Any] | None = None,
) -> None:
    """Mark the run ended (its lock, timer and queue place dropped)."""
    conn.execute(
        "UPDATE runs SET status=?, result=?, error=?, lock_owner=NULL, wake_at=NULL, "
        "waiting_for=NULL, finished_at=?, updated_at=?, queue_seq=NULL, suspect_seq=NULL "
        "WHERE run_id=?",
        (status.value, to_json(result), None if error is None else to_json(error), now, now,
         run_id),
    )
