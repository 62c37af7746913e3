"""SQLiteStore specifics: the schema version (an additive change upgrades an older file in
place; a file from a newer pyrula is refused) and closing a store others still use."""

from __future__ import annotations

import asyncio
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


async def test_closing_a_store_others_still_use_lets_their_calls_finish(tmp_path: Path) -> None:
    # A worker's lock-renewal thread closes the store when the worker stops, while another
    # worker (or the application) may still be using the same store object.
    store = SQLiteStore(tmp_path / "shared.db")
    try:
        handle, _ = await store.submit("wf", {}, now=1.0)

        async def reader() -> None:
            for _ in range(200):
                assert await store.get_run(handle.run_id) is not None

        async def closer() -> None:
            for _ in range(20):
                await store.aclose()
                await asyncio.sleep(0)

        await asyncio.gather(reader(), reader(), closer())
        assert await store.get_run(handle.run_id) is not None  # reopened on use
    finally:
        store.close()
