"""The SQLite schema's version: an additive change upgrades an older file in place; a file
from a newer pyrula is refused."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from pyrula.workflows import ConfigurationError, SQLiteStore
from pyrula.workflows.schedules import Schedule
from pyrula.workflows.stores.sqlite_schema import SCHEMA_VERSION


def _version(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        return int(conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0])


def _set_version(path: Path, version: int, *, drop: str | None = None) -> None:
    conn = sqlite3.connect(path)
    try:
        if drop is not None:
            conn.execute(f"DROP TABLE {drop}")
        conn.execute("UPDATE meta SET value=? WHERE key='schema_version'", (version,))
        conn.commit()
    finally:
        conn.close()


def test_a_version_1_file_gains_the_schedules_table(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    SQLiteStore(path).close()
    _set_version(path, 1, drop="schedules")  # what pyrula with schema 1 left behind

    store = SQLiteStore(path)
    try:
        assert _version(path) == SCHEMA_VERSION == 2
        store.schedule_create(Schedule.create("wf", "0 * * * *", schedule_id="s"))
        assert [s.schedule_id for s in store.schedule_list()] == ["s"]
    finally:
        store.close()


def test_a_file_from_a_newer_pyrula_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    SQLiteStore(path).close()
    _set_version(path, SCHEMA_VERSION + 1)
    with pytest.raises(ConfigurationError, match="schema version"):
        SQLiteStore(path)
