"""The collector's database: SQLite (a file) or PostgreSQL (asyncpg), one SQL for both.

Statements are written with ``?`` placeholders and in the SQL both accept (``ON
CONFLICT``, ``RETURNING``); the Postgres side numbers the placeholders. Every write runs
in ``transaction()``: on SQLite one connection on one thread, its transactions taken in
turn by an ``asyncio.Lock``; on Postgres a pooled connection's transaction.
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from pyrula.errors import ConfigurationError

STORE_ENV = "PYRULA_CLOUD_STORE"
#: Where the collector keeps what it receives unless told otherwise (its working directory).
DEFAULT_STORE = "sqlite:///pyrula-cloud.db"

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS cloud_keys (
        key_hash TEXT PRIMARY KEY, environment TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS cloud_events (
        environment TEXT NOT NULL, event_id TEXT NOT NULL, run_id TEXT NOT NULL,
        workflow TEXT NOT NULL, seq BIGINT NOT NULL, type TEXT NOT NULL,
        ts DOUBLE PRECISION, worker_id TEXT, received_at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (environment, event_id))""",
    """CREATE TABLE IF NOT EXISTS cloud_runs (
        environment TEXT NOT NULL, run_id TEXT NOT NULL, workflow TEXT NOT NULL,
        status TEXT NOT NULL, last_seq BIGINT NOT NULL, updated_at DOUBLE PRECISION NOT NULL,
        worker_id TEXT, fleet TEXT, error TEXT, PRIMARY KEY (environment, run_id))""",
    """CREATE TABLE IF NOT EXISTS cloud_workers (
        environment TEXT NOT NULL, worker_id TEXT NOT NULL, fleet TEXT NOT NULL,
        kind TEXT NOT NULL, host TEXT, pid BIGINT, state TEXT, in_flight BIGINT,
        runs_done BIGINT, workflows TEXT, build TEXT, last_seen DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (environment, worker_id))""",
    """CREATE TABLE IF NOT EXISTS cloud_submits (
        submit_id TEXT PRIMARY KEY, environment TEXT NOT NULL, workflow TEXT NOT NULL,
        params TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL, taken_by TEXT,
        taken_at DOUBLE PRECISION, run_id TEXT)""",
)


class Sql(Protocol):
    async def fetch(self, sql: str, *args: Any) -> list[dict[str, Any]]: ...

    async def execute(self, sql: str, *args: Any) -> None: ...


class Database(Sql, Protocol):
    def transaction(self) -> Any:
        """An async context manager giving a ``Sql`` whose statements commit together."""

    async def close(self) -> None: ...

    def where(self) -> str: ...


class SqliteDatabase:
    def __init__(self, path: Path) -> None:
        self._path = path
        self._thread: ThreadPoolExecutor | None = None
        self._lock = asyncio.Lock()
        self._conn: sqlite3.Connection | None = None

    def where(self) -> str:
        return str(self._path)

    def _open(self) -> None:
        conn = sqlite3.connect(self._path, check_same_thread=False, isolation_level=None)
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        for statement in SCHEMA:
            conn.execute(statement)
        self._conn = conn

    async def open(self) -> None:
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pyrula-cloud-db")
        await self._call(self._open)

    async def _call(self, fn: Any, *args: Any) -> Any:
        assert self._thread is not None, "open() first"
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    def _fetch(self, sql: str, args: Sequence[Any]) -> list[dict[str, Any]]:
        assert self._conn is not None
        return [dict(row) for row in self._conn.execute(sql, tuple(args)).fetchall()]

    async def fetch(self, sql: str, *args: Any) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = await self._call(self._fetch, sql, args)
        return rows

    async def execute(self, sql: str, *args: Any) -> None:
        await self._call(self._fetch, sql, args)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Sql]:
        async with self._lock:
            await self.execute("BEGIN IMMEDIATE")
            try:
                yield self
            except BaseException:
                await self.execute("ROLLBACK")
                raise
            await self.execute("COMMIT")

    async def close(self) -> None:
        if self._conn is not None:
            await self._call(self._conn.close)
            self._conn = None
        if self._thread is not None:
            self._thread.shutdown(wait=False)
            self._thread = None


def _numbered(sql: str) -> str:
    count = iter(range(1, 10_000))
    return re.sub(r"\?", lambda _: f"${next(count)}", sql)


class _PgSql:
    def __init__(self, conn: Any) -> None:
        self._conn = conn

    async def fetch(self, sql: str, *args: Any) -> list[dict[str, Any]]:
        return [dict(r) for r in await self._conn.fetch(_numbered(sql), *args)]

    async def execute(self, sql: str, *args: Any) -> None:
        await self._conn.execute(_numbered(sql), *args)


class PostgresDatabase:
    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        self._pool: Any = None

    def where(self) -> str:
        from pyrula.config.parse import redact_url

        return redact_url(self._dsn)

    async def open(self) -> None:
        import asyncpg

        self._pool = await asyncpg.create_pool(self._dsn, min_size=1, max_size=4)
        async with self._pool.acquire() as conn:
            for statement in SCHEMA:
                await conn.execute(statement)

    async def fetch(self, sql: str, *args: Any) -> list[dict[str, Any]]:
        async with self._pool.acquire() as conn:
            return await _PgSql(conn).fetch(sql, *args)

    async def execute(self, sql: str, *args: Any) -> None:
        async with self._pool.acquire() as conn:
            await _PgSql(conn).execute(sql, *args)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Sql]:
        async with self._pool.acquire() as conn, conn.transaction():
            yield _PgSql(conn)

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None


def database_for(url: str) -> SqliteDatabase | PostgresDatabase:
    """The database a ``--store`` URL names: ``sqlite:///PATH`` or ``postgresql://...``."""
    scheme = urlsplit(url).scheme
    if scheme in ("postgresql", "postgres"):
        return PostgresDatabase(url)
    if scheme == "sqlite" and url.startswith("sqlite:///") and len(url) > len("sqlite:///"):
        return SqliteDatabase(Path(url[len("sqlite:///"):]))
    raise ConfigurationError(
        f"--store must be sqlite:///PATH or a postgresql:// DSN, got {url!r}"
    )
