"""The machine's PostgreSQL for the archive tests: databases of the suite's own.

Tests never touch a database they did not create: each one here is named
``pyrula_test_<random>``, created through the admin DSN's ``postgres`` database and dropped
(``WITH (FORCE)``) when its fixture ends. The server itself is never stopped or
reconfigured. ``$PYRULA_TEST_POSTGRES_ADMIN_DSN`` overrides the default
``postgresql://postgres@127.0.0.1:5432/postgres``; without a server the tests skip.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import uuid
from typing import Any
from urllib.parse import urlsplit

ADMIN_DSN = os.environ.get(
    "PYRULA_TEST_POSTGRES_ADMIN_DSN", "postgresql://postgres@127.0.0.1:5432/postgres"
)


class PostgresAdmin:
    """Creates and drops the suite's databases on the server behind ``ADMIN_DSN``."""

    def __init__(self, admin_dsn: str = ADMIN_DSN) -> None:
        self.admin_dsn = admin_dsn
        self.created: set[str] = set()

    def _run(self, sql: str) -> Any:
        import asyncpg

        async def run() -> Any:
            conn = await asyncpg.connect(self.admin_dsn, timeout=5)
            try:
                return await conn.fetchval(sql)
            finally:
                await conn.close()

        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(run())
        # Called from a test's event loop: run on a thread of its own (a few ms of SQL).
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            return pool.submit(asyncio.run, run()).result()

    def reachable(self) -> str | None:
        """None if the server answers, else why not."""
        try:
            import asyncpg  # noqa: F401
        except ImportError:
            return "asyncpg is not installed"
        try:
            self._run("SELECT 1")
        except Exception as exc:  # any failure means: no server for these tests
            return f"no PostgreSQL at {self.admin_dsn}: {exc}"
        return None

    def dsn(self, database: str) -> str:
        return urlsplit(self.admin_dsn)._replace(path=f"/{database}").geturl()

    def create_database(self) -> str:
        """A new empty database of the suite's own; returns its name."""
        name = f"pyrula_test_{uuid.uuid4().hex[:16]}"
        self._run(f'CREATE DATABASE "{name}"')
        self.created.add(name)
        return name

    def drop_database(self, name: str) -> None:
        assert name in self.created, f"refusing to drop {name!r}: not created by the suite"
        self._run(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        self.created.discard(name)

    def allow_connections(self, name: str, allowed: bool) -> None:
        """Open or close one of the suite's databases to new connections; closing it also
        ends the connections it has (an outage of that database only)."""
        assert name in self.created, f"refusing to alter {name!r}: not created by the suite"
        self._run(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS {"true" if allowed else "false"}')
        if not allowed:
            self._run(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                f"WHERE datname = '{name}' AND pid <> pg_backend_pid()"
            )
