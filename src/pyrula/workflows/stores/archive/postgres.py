"""PostgresArchive: finished runs and their journals, kept in Postgres (asyncpg).

Every row carries the ``namespace`` of the live store it came from, so several live
namespaces (staging, production) can share one database. Reads given no namespace look
in all of them (run ids are unique). Connections come from one pool per event loop
(pool.py, which also says how errors are raised); the schema is checked once per object
before its first read or write (ArchiveSchemaMismatch).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import orjson

from pyrula.config.defaults import ARCHIVE_DSN_ENV
from pyrula.errors import ArchiveSchemaMismatch, ConfigurationError, WorkflowNotFound
from pyrula.workflows.events import Event
from pyrula.workflows.records import RunInfo, RunStatus
from pyrula.workflows.stores.archive.pool import LoopPools, redact
from pyrula.workflows.stores.archive.rows import (
    RUN_COLUMNS,
    UPSERT_RUNS,
    run_info,
    upsert_arguments,
)
from pyrula.workflows.stores.archive.schema import (
    BASELINE,
    CURRENT_VERSION,
    MIGRATIONS,
    VERSION_TABLE,
    check_schema_name,
    compat_after,
)

DSN_SCHEMES = ("postgres", "postgresql")



@dataclass(frozen=True, slots=True)
class SchemaStatus:
    """What ``check()`` found: the database's baseline, version and compat floor, and
    the version this build needs."""

    schema: str
    baseline: str
    version: int
    compat: int
    needed: int = CURRENT_VERSION

    def __str__(self) -> str:
        return (f"schema {self.schema!r} baseline {self.baseline} version {self.version} "
                f"(this build needs {self.needed})")


@dataclass(frozen=True, slots=True)
class MigrateResult:
    schema: str
    before: int
    after: int

    def __str__(self) -> str:
        if self.before == self.after:
            return f"schema {self.schema!r} is at version {self.after}: nothing to do"
        return f"schema {self.schema!r} migrated from version {self.before} to {self.after}"


class PostgresArchive:
    """``PostgresArchive(dsn=..., schema="pyrula")``; ``dsn`` defaults to
    ``$PYRULA_POSTGRES_DSN``."""

    def __init__(
        self,
        dsn: str | None = None,
        *,
        schema: str = "pyrula",
        max_connections: int = 10,
        connect_timeout: float = 5.0,
        command_timeout: float = 30.0,
    ) -> None:
        dsn = dsn if dsn is not None else (os.environ.get(ARCHIVE_DSN_ENV) or "").strip()
        if not dsn:
            raise ConfigurationError(
                f"PostgresArchive needs a DSN: pass dsn='postgresql://...' or set "
                f"{ARCHIVE_DSN_ENV}"
            )
        scheme = urlsplit(dsn).scheme.lower() if "://" in dsn else ""
        if scheme not in DSN_SCHEMES:
            raise ConfigurationError(
                f"PostgresArchive dsn must start with postgresql:// or postgres://, "
                f"got {redact(dsn)!r}"
            )
        if isinstance(max_connections, bool) or not isinstance(max_connections, int) or (
            max_connections < 2
        ):
            raise ConfigurationError(
                f"max_connections must be an int >= 2, got {max_connections!r}"
            )
        for label, value in (("connect_timeout", connect_timeout),
                             ("command_timeout", command_timeout)):
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ConfigurationError(f"{label} must be seconds > 0, got {value!r}")
        self.dsn = dsn
        self.schema = check_schema_name(schema)
        self._pools = LoopPools(dsn, schema=self.schema, max_size=max_connections,
                                connect_timeout=float(connect_timeout),
                                command_timeout=float(command_timeout))
        self._checked = False

    # --- connections ----------------------------------------------------------------

    def where(self) -> str:
        """host:port/database, for messages."""
        return self._pools.where()

    @contextlib.asynccontextmanager
    async def _conn(self, *, checked: bool = True) -> AsyncIterator[Any]:
        """A pooled connection of this loop, the schema checked first (once per object)."""
        if checked and not self._checked:
            await self.check()
        try:
            async with self._pools.connection() as conn:
                yield conn
        except ArchiveSchemaMismatch:
            self._checked = False  # check again before the next use
            raise

    # --- schema ---------------------------------------------------------------------

    def _sql(self, statement: str) -> str:
        return statement.replace("{schema}", self.schema)

    async def _version_row(self, conn: Any) -> Any:
        table = await conn.fetchval("SELECT to_regclass($1)", f"{self.schema}.archive_schema")
        if table is None:
            return None
        return await conn.fetchrow(
            self._sql("SELECT baseline, version, compat FROM {schema}.archive_schema")
        )

    async def check(self) -> SchemaStatus:
        """Raise ArchiveSchemaMismatch unless the database holds a schema this build can
        use (same baseline, migrated at least to this build's version, no contracting
        migration this build does not know); StoreUnavailable if it cannot be reached."""
        async with self._conn(checked=False) as conn:
            row = await self._version_row(conn)
        where = f"{self.where()} (schema {self.schema!r})"
        if row is None:
            raise ArchiveSchemaMismatch(
                f"no pyrula archive schema in {where}: run `pyrula db migrate`"
            )
        status = SchemaStatus(self.schema, row["baseline"], row["version"], row["compat"])
        if status.baseline != BASELINE:
            raise ArchiveSchemaMismatch(
                f"the archive schema in {where} is from baseline {status.baseline!r}, this "
                f"build uses {BASELINE!r}: recreate the database and run `pyrula db migrate`"
            )
        if status.version < CURRENT_VERSION:
            raise ArchiveSchemaMismatch(
                f"the archive schema in {where} is at version {status.version}, this build "
                f"needs {CURRENT_VERSION}: run `pyrula db migrate`"
            )
        if status.compat > CURRENT_VERSION:
            raise ArchiveSchemaMismatch(
                f"the archive schema in {where} was migrated to version {status.version} by "
                f"a newer build, with a contracting migration (version {status.compat}) this "
                f"build (version {CURRENT_VERSION}) cannot use: upgrade this worker"
            )
        self._checked = True
        return status

    async def migrate(self) -> MigrateResult:
        """Create the schema or bring it to this build's version, in one transaction
        (concurrent migrations wait for each other). Refuses a foreign baseline."""
        async with self._conn(checked=False) as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
                               f"pyrula.archive.migrate:{self.schema}")
            await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {self.schema}")
            row = await self._version_row(conn)
            if row is None:
                runs = await conn.fetchval("SELECT to_regclass($1)", f"{self.schema}.runs")
                if runs is not None:
                    raise ArchiveSchemaMismatch(
                        f"schema {self.schema!r} in {self.where()} has a runs table but no "
                        "pyrula version record: it is not a pyrula archive; use another "
                        "schema or database"
                    )
                await conn.execute(self._sql(VERSION_TABLE))
                await conn.execute(
                    self._sql("INSERT INTO {schema}.archive_schema (baseline, version, compat) "
                              "VALUES ($1, 0, 0)"), BASELINE,
                )
                before, compat = 0, 0
            else:
                if row["baseline"] != BASELINE:
                    raise ArchiveSchemaMismatch(
                        f"schema {self.schema!r} in {self.where()} is from baseline "
                        f"{row['baseline']!r}, this build uses {BASELINE!r}: recreate the "
                        "database and migrate again"
                    )
                before, compat = int(row["version"]), int(row["compat"])
                if compat > CURRENT_VERSION:
                    raise ArchiveSchemaMismatch(
                        f"schema {self.schema!r} in {self.where()} was migrated by a newer "
                        f"build (version {before}, contracting migration {compat}); "
                        "migrate with that build"
                    )
            for migration in MIGRATIONS:
                if migration.version > before:
                    for statement in migration.statements:
                        await conn.execute(self._sql(statement))
            after = max(before, CURRENT_VERSION)
            await conn.execute(
                self._sql("UPDATE {schema}.archive_schema SET version = $1, compat = $2, "
                          "updated_at = now()"), after, compat_after(CURRENT_VERSION, compat),
            )
        self._checked = False  # check again on next use, against what is there now
        return MigrateResult(self.schema, before, after)

    # --- writes ---------------------------------------------------------------------

    async def upsert_runs(
        self, namespace: str, records: Iterable[tuple[RunInfo, Sequence[Event]]]
    ) -> int:
        """Archive finished runs (their RunInfo and whole journal) in one atomic statement.

        Idempotent: archiving a run again rewrites its row and its events (by seq); a run's
        journal is final once it has ended, so that is the same journal. Returns how many
        runs were written. Raises ValueError for a run that has not ended.
        """
        count, arguments = upsert_arguments(namespace, records)
        if count:
            async with self._conn() as conn:
                await conn.execute(self._sql(UPSERT_RUNS), *arguments)
        return count

    async def archive_run(self, namespace: str, info: RunInfo, events: Sequence[Event]) -> None:
        """Archive one finished run (see ``upsert_runs``)."""
        await self.upsert_runs(namespace, [(info, events)])

    # --- reads ----------------------------------------------------------------------

    async def get_run(self, run_id: str, namespace: str | None = None) -> RunInfo | None:
        async with self._conn() as conn:
            if namespace is None:
                row = await conn.fetchrow(
                    self._sql(f"SELECT {RUN_COLUMNS} FROM {{schema}}.runs WHERE run_id = $1 "
                              "LIMIT 1"), run_id,
                )
            else:
                row = await conn.fetchrow(
                    self._sql(f"SELECT {RUN_COLUMNS} FROM {{schema}}.runs "
                              "WHERE namespace = $1 AND run_id = $2"), namespace, run_id,
                )
        return None if row is None else run_info(row)

    async def read_events(
        self, run_id: str, after_seq: int = 0, namespace: str | None = None
    ) -> list[Event]:
        """The archived journal after ``after_seq``; WorkflowNotFound if not archived."""
        async with self._conn() as conn:
            if namespace is None:
                namespace = await conn.fetchval(
                    self._sql("SELECT namespace FROM {schema}.runs WHERE run_id = $1 LIMIT 1"),
                    run_id,
                )
                found = namespace is not None
            else:
                found = bool(await conn.fetchval(
                    self._sql("SELECT 1 FROM {schema}.runs WHERE namespace = $1 "
                              "AND run_id = $2"), namespace, run_id,
                ))
            if not found:
                raise WorkflowNotFound(f"no run with id {run_id!r}")
            rows = await conn.fetch(
                self._sql("SELECT data FROM {schema}.events WHERE namespace = $1 "
                          "AND run_id = $2 AND seq > $3 ORDER BY seq"),
                namespace, run_id, after_seq,
            )
        return [orjson.loads(row["data"]) for row in rows]

    async def list_runs(
        self,
        *,
        namespace: str | None = None,
        name: str | None = None,
        status: RunStatus | str | None = None,
        owner: str | None = None,
        limit: int = 100,
        before: tuple[float, str] | None = None,
    ) -> list[RunInfo]:
        """Archived runs newest first (by created_at, run_id), as ``Store.list_runs``."""
        where: list[str] = []
        args: list[Any] = []

        def arg(value: Any) -> str:
            args.append(value)
            return f"${len(args)}"

        if namespace is not None:
            where.append(f"namespace = {arg(namespace)}")
        if name is not None:
            where.append(f"name = {arg(name)}")
        if status is not None:
            where.append(f"status = {arg(RunStatus(status).value)}")
        if owner is not None:
            where.append(f"owner = {arg(owner)}")
        if before is not None:
            where.append(f"(created_at, run_id) < ({arg(float(before[0]))}, {arg(before[1])})")
        clause = f"WHERE {' AND '.join(where)} " if where else ""
        query = (f"SELECT {RUN_COLUMNS} FROM {{schema}}.runs {clause}"
                 f"ORDER BY created_at DESC, run_id DESC LIMIT {arg(max(0, int(limit)))}")
        async with self._conn() as conn:
            rows = await conn.fetch(self._sql(query), *args)
        return [run_info(row) for row in rows]

    async def ended_infos(
        self, namespace: str, names: Sequence[str], *, after: tuple[float, str] | None,
        until: float, limit: int,
    ) -> list[RunInfo]:
        """Archived runs of the workflows ``names`` with (finished_at, run_id) > ``after``
        and finished_at <= ``until``, in that order, at most ``limit`` (the projections'
        reads of the runs the live store no longer keeps)."""
        low = (float("-inf"), "") if after is None else (float(after[0]), str(after[1]))
        async with self._conn() as conn:
            rows = await conn.fetch(
                self._sql(f"SELECT {RUN_COLUMNS} FROM {{schema}}.runs WHERE namespace = $1 "
                          "AND name = ANY($2::text[]) AND finished_at IS NOT NULL "
                          "AND (finished_at, run_id) > ($3, $4) AND finished_at <= $5 "
                          "ORDER BY finished_at, run_id LIMIT $6"),
                namespace, list(names), low[0], low[1], float(until), max(0, int(limit)),
            )
        return [run_info(row) for row in rows]

    async def archived(self, namespace: str, run_ids: Sequence[str]) -> set[str]:
        """Which of ``run_ids`` are archived (in ``namespace``)."""
        if not run_ids:
            return set()
        async with self._conn() as conn:
            rows = await conn.fetch(
                self._sql("SELECT run_id FROM {schema}.runs WHERE namespace = $1 "
                          "AND run_id = ANY($2::text[])"), namespace, list(run_ids),
            )
        return {row["run_id"] for row in rows}

    # --- the reconcile cursor and leader lock ----------------------------------------

    async def cursor(self, namespace: str) -> tuple[float, str] | None:
        """Where reconciliation of ``namespace`` has reached: every run of the live store
        that ended at or before it (finished_at, run_id) is archived."""
        async with self._conn() as conn:
            row = await conn.fetchrow(
                self._sql("SELECT finished_at, run_id FROM {schema}.cursors "
                          "WHERE namespace = $1"), namespace,
            )
        return None if row is None else (float(row["finished_at"]), str(row["run_id"]))

    async def set_cursor(self, namespace: str, cursor: tuple[float, str]) -> None:
        async with self._conn() as conn:
            await conn.execute(
                self._sql("INSERT INTO {schema}.cursors (namespace, finished_at, run_id) "
                          "VALUES ($1, $2, $3) ON CONFLICT (namespace) DO UPDATE SET "
                          "finished_at = EXCLUDED.finished_at, run_id = EXCLUDED.run_id, "
                          "updated_at = now()"),
                namespace, float(cursor[0]), cursor[1],
            )

    @contextlib.asynccontextmanager
    async def leader(self, namespace: str) -> AsyncIterator[bool]:
        """Yield True if this caller holds the reconcile lock of ``namespace`` (a session
        advisory lock: released on exit, or by the server if the connection dies). Errors
        of the body are not translated."""
        key = f"pyrula.archive.reconcile:{self.schema}:{namespace}"
        if not self._checked:
            await self.check()
        pool, conn = await self._pools.acquire()
        try:
            with self._pools.translated(conn):
                got = bool(await conn.fetchval(
                    "SELECT pg_try_advisory_lock(hashtextextended($1, 0))", key
                ))
            try:
                yield got
            finally:
                if got:
                    with contextlib.suppress(Exception):
                        await conn.execute(
                            "SELECT pg_advisory_unlock(hashtextextended($1, 0))", key
                        )
        finally:
            with contextlib.suppress(Exception):
                await pool.release(conn)

    # --- lifecycle ------------------------------------------------------------------

    async def aping(self) -> None:
        async with self._conn(checked=False) as conn:
            await conn.fetchval("SELECT 1")

    async def aclose(self) -> None:
        """Close this event loop's pool."""
        await self._pools.aclose()

    def close(self) -> None:
        """Close the pools of every loop still running."""
        self._pools.close()

    def __repr__(self) -> str:
        return f"PostgresArchive({self.where()!r}, schema={self.schema!r})"
