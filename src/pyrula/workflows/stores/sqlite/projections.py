"""Projections in the SQLite store: ``projection_heads`` and ``projection_states``
(schema.py). A save checks the head's version and writes the states and the head in one
transaction, so of two folders that read the same version only the first one's write
lands; the ended runs to fold are read by the ``runs_ended`` index."""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from typing import Any

from pyrula.workflows.records import RunInfo
from pyrula.workflows.stores.capabilities import ProjectionHead
from pyrula.workflows.stores.sqlite.calls import Calls
from pyrula.workflows.stores.sqlite.connection import Database
from pyrula.workflows.stores.sqlite.rows import RUN_COLUMNS, TERMINAL, from_json, run_info, to_json

_HEAD_COLUMNS = "name, version, fingerprint, keyed, cp_at, cp_id, folded, updated_at"


def _head(row: sqlite3.Row | tuple[Any, ...]) -> ProjectionHead:
    checkpoint = None if row[4] is None else (float(row[4]), str(row[5]))
    return ProjectionHead(str(row[0]), int(row[1]), str(row[2]), bool(row[3]), checkpoint,
                          int(row[6]), float(row[7]))


class SQLiteProjections:
    """The projections' heads and states (Projections)."""

    def __init__(self, db: Database, calls: Calls) -> None:
        self._db = db
        self._calls = calls

    async def ended_infos(
        self, names: Sequence[str], *, after: tuple[float, str] | None, until: float,
        limit: int,
    ) -> list[RunInfo]:
        low = (float("-inf"), "") if after is None else (float(after[0]), str(after[1]))
        marks = ",".join("?" * len(names))
        sql = (f"SELECT {RUN_COLUMNS} FROM runs WHERE name IN ({marks}) "
               f"AND finished_at IS NOT NULL AND status IN ({TERMINAL}) "
               "AND (finished_at > ? OR (finished_at = ? AND run_id > ?)) AND finished_at <= ? "
               "ORDER BY finished_at, run_id LIMIT ?")

        def op(conn: sqlite3.Connection) -> list[RunInfo]:
            rows = conn.execute(sql, (*names, low[0], low[0], low[1], until, limit))
            return [run_info(row) for row in rows.fetchall()]

        if not names or limit <= 0:
            return []
        return await self._calls.call(lambda: self._db.read(op))

    async def projection_head(self, name: str) -> ProjectionHead | None:
        def op(conn: sqlite3.Connection) -> ProjectionHead | None:
            row = conn.execute(f"SELECT {_HEAD_COLUMNS} FROM projection_heads WHERE name=?",
                               (name,)).fetchone()
            return None if row is None else _head(row)

        return await self._calls.call(lambda: self._db.read(op), inline=True)

    async def projection_heads(self) -> list[ProjectionHead]:
        def op(conn: sqlite3.Connection) -> list[ProjectionHead]:
            rows = conn.execute(f"SELECT {_HEAD_COLUMNS} FROM projection_heads ORDER BY name")
            return [_head(row) for row in rows.fetchall()]

        return await self._calls.call(lambda: self._db.read(op), inline=True)

    async def projection_states(self, name: str, keys: Sequence[str] | None
                                ) -> dict[str, Any]:
        def op(conn: sqlite3.Connection) -> dict[str, Any]:
            if keys is None:
                rows = conn.execute("SELECT key, state FROM projection_states WHERE name=?",
                                    (name,)).fetchall()
            else:
                rows = []
                wanted = list(keys)
                for i in range(0, len(wanted), 500):
                    chunk = wanted[i:i + 500]
                    rows += conn.execute(
                        "SELECT key, state FROM projection_states WHERE name=? AND key IN "
                        f"({','.join('?' * len(chunk))})", (name, *chunk)).fetchall()
            return {str(row[0]): from_json(row[1]) for row in rows}

        return await self._calls.call(lambda: self._db.read(op))

    async def save_projection(
        self, head: ProjectionHead, states: Mapping[str, Any], *, expected: int,
        reset: bool,
    ) -> bool:
        encoded = [(head.name, key, to_json(state)) for key, state in states.items()]

        def op() -> bool:
            with self._db.tx() as conn:
                if _version(conn, head.name) != expected:
                    return False
                if reset:
                    conn.execute("DELETE FROM projection_states WHERE name=?", (head.name,))
                conn.executemany("INSERT OR REPLACE INTO projection_states(name, key, state) "
                                 "VALUES (?, ?, ?)", encoded)
                _write_head(conn, head, expected + 1)
                return True

        return await self._calls.call(op)

    async def reset_projection(self, name: str, *, now: float) -> bool:
        def op() -> bool:
            with self._db.tx() as conn:
                row = conn.execute("SELECT version, keyed FROM projection_heads WHERE name=?",
                                   (name,)).fetchone()
                if row is None:
                    return False
                conn.execute("DELETE FROM projection_states WHERE name=?", (name,))
                _write_head(conn, ProjectionHead(name, 0, "", bool(row[1]), None, 0, now),
                            int(row[0]) + 1)
                return True

        return await self._calls.call(op)


def _version(conn: sqlite3.Connection, name: str) -> int:
    row = conn.execute("SELECT version FROM projection_heads WHERE name=?", (name,)).fetchone()
    return 0 if row is None else int(row[0])


def _write_head(conn: sqlite3.Connection, head: ProjectionHead, version: int) -> None:
    cp_at, cp_id = (None, None) if head.checkpoint is None else head.checkpoint
    conn.execute(
        f"INSERT OR REPLACE INTO projection_heads({_HEAD_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, "
        "?, ?)",
        (head.name, version, head.fingerprint, int(head.keyed), cp_at, cp_id, head.folded,
         head.updated_at),
    )
