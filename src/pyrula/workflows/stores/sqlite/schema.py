"""The SQLite store's schema and its migration. Bump SCHEMA_VERSION with any change to it.

A change that only adds tables, indexes (``CREATE ... IF NOT EXISTS``) or nullable
columns (ADDED_COLUMNS) lists the versions it upgrades in place in ADDITIVE_FROM: opening
such a file creates what is new and records the new version.
"""

from __future__ import annotations

import logging
import sqlite3

from pyrula.workflows.errors import ConfigurationError

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 9
#: Versions this schema upgrades in place (2 added the schedules table, 3 runs.queued_at,
#: 4 runs.suspect_seq, 5 the trigger_* tables of events and batch triggers, 6 the
#: projection_* tables and the runs_ended index, 7 runs.priority and the runs_queue_p
#: index in place of runs_queue, 8 the runs.limit_* columns of per-key limits, their
#: runs_held and runs_slots indexes and the limit_buckets table, 9 runs.nudged).
ADDITIVE_FROM = frozenset({1, 2, 3, 4, 5, 6, 7, 8})

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS meta (
        key TEXT PRIMARY KEY,
        value TEXT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS runs (
        run_id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        owner TEXT NOT NULL DEFAULT '',
        params BLOB,
        status TEXT NOT NULL,
        attempt INTEGER NOT NULL DEFAULT 0,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        started_at REAL,
        finished_at REAL,
        result BLOB,
        error BLOB,
        lock_owner TEXT,
        lock_expires REAL,
        wake_at REAL,
        waiting_for BLOB,
        interrupt BLOB,
        idempotency_key TEXT,
        start_id TEXT NOT NULL,
        successor_id TEXT,
        cancel_requested INTEGER NOT NULL DEFAULT 0,
        crashes BLOB NOT NULL DEFAULT '[]',
        signal_seq BLOB NOT NULL DEFAULT '{}',
        journal_len INTEGER NOT NULL DEFAULT 0,
        parked_seq INTEGER NOT NULL DEFAULT 0,
        queue_seq INTEGER,
        queued_at REAL,
        suspect_seq INTEGER,
        priority INTEGER NOT NULL DEFAULT 0,
        limit_conc TEXT,
        limit_rate TEXT,
        limit_line TEXT,
        limit_seq INTEGER,
        nudged INTEGER NOT NULL DEFAULT 0
    )""",
    """CREATE UNIQUE INDEX IF NOT EXISTS runs_idempotency
        ON runs(name, idempotency_key) WHERE idempotency_key IS NOT NULL""",
    """CREATE INDEX IF NOT EXISTS runs_timers
        ON runs(wake_at) WHERE status IN ('sleeping', 'waiting') AND wake_at IS NOT NULL""",
    """CREATE INDEX IF NOT EXISTS runs_locks
        ON runs(lock_expires) WHERE status = 'running'""",
    """CREATE INDEX IF NOT EXISTS runs_owner_status ON runs(owner, status)""",
    """CREATE INDEX IF NOT EXISTS runs_listing ON runs(created_at, run_id)""",
    """CREATE TABLE IF NOT EXISTS events (
        run_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        data BLOB NOT NULL,
        PRIMARY KEY (run_id, seq)
    ) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS served (
        name TEXT NOT NULL,
        owner TEXT NOT NULL,
        served REAL NOT NULL DEFAULT 0,
        PRIMARY KEY (name, owner)
    ) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS workers (
        worker_id TEXT PRIMARY KEY,
        names BLOB NOT NULL,
        expires REAL NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS schedules (
        schedule_id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        definition TEXT NOT NULL,
        paused INTEGER NOT NULL DEFAULT 0,
        next_run_at REAL NOT NULL,
        last_run_id TEXT,
        last_run_at REAL
    )""",
    """CREATE INDEX IF NOT EXISTS schedules_due
        ON schedules(name, next_run_at) WHERE paused = 0""",
    # Events (client.emit): ``seq`` is the emit order of every topic's log.
    """CREATE TABLE IF NOT EXISTS trigger_events (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        event_id TEXT NOT NULL UNIQUE,
        topic TEXT NOT NULL,
        key TEXT,
        owner TEXT NOT NULL DEFAULT '',
        payload BLOB NOT NULL,
        emitted_at REAL NOT NULL
    )""",
    """CREATE UNIQUE INDEX IF NOT EXISTS trigger_events_key
        ON trigger_events(topic, key) WHERE key IS NOT NULL""",
    """CREATE INDEX IF NOT EXISTS trigger_events_topic ON trigger_events(topic, seq)""",
    # A workflow triggered by a topic: the log's events up to ``routed`` are pending for it
    # (in trigger_pending until a batch takes them) or predate it.
    """CREATE TABLE IF NOT EXISTS trigger_subs (
        name TEXT NOT NULL,
        topic TEXT NOT NULL,
        routed INTEGER NOT NULL,
        PRIMARY KEY (name, topic)
    ) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS trigger_pending (
        name TEXT NOT NULL,
        topic TEXT NOT NULL,
        owner TEXT NOT NULL,
        seq INTEGER NOT NULL,
        PRIMARY KEY (name, topic, owner, seq)
    ) WITHOUT ROWID""",
    # Projections (@projection): a head per projection, written with a compare-and-set on
    # ``version`` in the transaction that writes its states; ``cp_at, cp_id`` the
    # (finished_at, run_id) of the last run folded.
    """CREATE TABLE IF NOT EXISTS projection_heads (
        name TEXT PRIMARY KEY,
        version INTEGER NOT NULL,
        fingerprint TEXT NOT NULL,
        keyed INTEGER NOT NULL,
        cp_at REAL,
        cp_id TEXT,
        folded INTEGER NOT NULL,
        updated_at REAL NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS projection_states (
        name TEXT NOT NULL,
        key TEXT NOT NULL,
        state BLOB NOT NULL,
        PRIMARY KEY (name, key)
    ) WITHOUT ROWID""",
    # The ended runs of a workflow in the order projections fold them.
    """CREATE INDEX IF NOT EXISTS runs_ended
        ON runs(name, finished_at, run_id) WHERE finished_at IS NOT NULL""",
    """CREATE TABLE IF NOT EXISTS flow_control (
        owner TEXT PRIMARY KEY,
        max_concurrent INTEGER,
        max_starts_per_second REAL,
        tokens REAL,
        stamp REAL
    )""",
    # Per-key start rates (@workflow(rate=...)): each (workflow, rate key)'s token bucket.
    """CREATE TABLE IF NOT EXISTS limit_buckets (
        name TEXT NOT NULL,
        key TEXT NOT NULL,
        tokens REAL NOT NULL,
        stamp REAL NOT NULL,
        PRIMARY KEY (name, key)
    ) WITHOUT ROWID""",
)


#: Columns added to a table after it was first created: (table, column, declaration, the
#: statement that fills it in on a file that lacked it).
ADDED_COLUMNS = (
    # When a queued run became claimable: a run never claimed, when it was created; any
    # other is dated by its last write (an older pyrula kept no better record of when it
    # was requeued or woken).
    ("runs", "queued_at", "REAL",
     "UPDATE runs SET queued_at=CASE WHEN attempt=0 THEN created_at ELSE updated_at END "
     "WHERE status='queued'"),
    # Set while the run is a suspect (a crash counted, no attempt completed since): queued,
    # it waits apart from its owner's queue, in this order. An older pyrula queued every
    # run in its owner's queue: none is a suspect.
    ("runs", "suspect_seq", "INTEGER", "SELECT 1"),
    # 0..9: among its owner's queued runs, a higher one is claimed first. An older pyrula
    # had no priorities: every run is 0.
    ("runs", "priority", "INTEGER NOT NULL DEFAULT 0", "SELECT 1"),
    # Per-key limits (sqlite/limits.py): the run's concurrency and rate keys; while it
    # waits in its key's line (queued, queue_seq NULL), the line and its place in it. An
    # older pyrula kept no keys: no run has any.
    ("runs", "limit_conc", "TEXT", "SELECT 1"),
    ("runs", "limit_rate", "TEXT", "SELECT 1"),
    ("runs", "limit_line", "TEXT", "SELECT 1"),
    ("runs", "limit_seq", "INTEGER", "SELECT 1"),
    # A child ended while the run ran (the store's ``nudge``): its next park waiting for
    # its children does not park. An older pyrula nudged through the journal: none is.
    ("runs", "nudged", "INTEGER NOT NULL DEFAULT 0", "SELECT 1"),
)

#: What is built on the added columns: made once they exist.
LATE_SCHEMA = (
    # Each owner's queue of a name in claim order: highest priority first, FIFO within
    # one (it replaces runs_queue, which lacked the priority).
    """CREATE INDEX IF NOT EXISTS runs_queue_p
        ON runs(name, owner, priority DESC, queue_seq) WHERE status = 'queued'""",
    "DROP INDEX IF EXISTS runs_queue",
    """CREATE INDEX IF NOT EXISTS runs_suspects
        ON runs(name, suspect_seq) WHERE status = 'queued' AND suspect_seq IS NOT NULL""",
    # Each key's waiting line of a name, FIFO.
    """CREATE INDEX IF NOT EXISTS runs_held
        ON runs(name, limit_line, limit_seq) WHERE status = 'queued' AND limit_line IS NOT NULL""",
    # The runs of a concurrency key, to count those holding a slot.
    """CREATE INDEX IF NOT EXISTS runs_slots
        ON runs(name, limit_conc, status, queue_seq) WHERE limit_conc IS NOT NULL""",
)


def _add_columns(conn: sqlite3.Connection) -> None:
    for table, column, declaration, backfill in ADDED_COLUMNS:
        present = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
        if column not in present:
            conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {declaration}")
            conn.execute(backfill)


def migrate(conn: sqlite3.Connection, path: str) -> None:
    """Create what is missing of the schema and record its version, in one transaction.

    Raises ConfigurationError for a file of another schema version this one cannot
    upgrade in place (nothing is changed then).
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        for statement in SCHEMA:
            conn.execute(statement)
        row = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        if row is None:
            conn.execute(
                "INSERT INTO meta(key, value) VALUES ('schema_version', ?)", (SCHEMA_VERSION,)
            )
        elif int(row[0]) in ADDITIVE_FROM:
            _add_columns(conn)
            conn.execute("UPDATE meta SET value=? WHERE key='schema_version'", (SCHEMA_VERSION,))
        elif int(row[0]) != SCHEMA_VERSION:
            raise ConfigurationError(
                f"SQLite store {path} has schema version {row[0]}, this pyrula "
                f"needs {SCHEMA_VERSION}"
            )
        for statement in LATE_SCHEMA:
            conn.execute(statement)
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
