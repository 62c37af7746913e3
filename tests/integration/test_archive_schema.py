"""The Postgres archive's schema: migrate, check, and who refuses a database (and how).

Each test takes a database of its own (``fresh_postgres_dsn``, empty, dropped after it).
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import asyncpg
import pytest
from click.testing import CliRunner

from pyrula.cli.main import cli
from pyrula.workflows import (
    ArchiveSchemaMismatch,
    ArchivingStore,
    PostgresArchive,
    ValkeyStore,
    WorkflowContext,
    WorkflowWorker,
    workflow,
)
from pyrula.workflows.stores.archive import BASELINE, CURRENT_VERSION
from tests.unit.worker.worker_support import fast_options

pytestmark = pytest.mark.postgres


@workflow(name="archive_schema.noop")
async def noop(ctx: WorkflowContext, params: Any) -> Any:
    return params


async def _sql(dsn: str, statement: str) -> Any:
    conn = await asyncpg.connect(dsn)
    try:
        return await conn.fetchval(statement)
    finally:
        await conn.close()


async def _migrated(dsn: str) -> PostgresArchive:
    archive = PostgresArchive(dsn=dsn)
    await archive.migrate()
    return archive


async def test_migrate_creates_the_schema_and_check_accepts_it(fresh_postgres_dsn: str) -> None:
    archive = PostgresArchive(dsn=fresh_postgres_dsn)
    try:
        first = await archive.migrate()
        again = await archive.migrate()
        status = await archive.check()
    finally:
        await archive.aclose()

    assert (first.before, first.after) == (0, CURRENT_VERSION)
    assert (again.before, again.after) == (CURRENT_VERSION, CURRENT_VERSION)
    assert "nothing to do" in str(again)
    assert (status.baseline, status.version, status.compat) == (BASELINE, CURRENT_VERSION, 1)
    tables = await _sql(
        fresh_postgres_dsn,
        "SELECT string_agg(tablename, ',' ORDER BY tablename) FROM pg_tables "
        "WHERE schemaname = 'pyrula'",
    )
    assert tables == "archive_schema,cursors,events,runs"


async def test_concurrent_migrations_apply_the_schema_once(fresh_postgres_dsn: str) -> None:
    archives = [PostgresArchive(dsn=fresh_postgres_dsn) for _ in range(4)]
    try:
        results = await asyncio.gather(*(a.migrate() for a in archives))
    finally:
        await asyncio.gather(*(a.aclose() for a in archives))

    assert sorted(r.before for r in results) == [0] + [CURRENT_VERSION] * 3


async def test_check_refuses_a_database_without_the_schema(fresh_postgres_dsn: str) -> None:
    archive = PostgresArchive(dsn=fresh_postgres_dsn)
    try:
        with pytest.raises(ArchiveSchemaMismatch, match="pyrula db migrate"):
            await archive.check()
        # Any first use checks the schema first.
        with pytest.raises(ArchiveSchemaMismatch, match="no pyrula archive schema"):
            await archive.get_run("0" * 32)
    finally:
        await archive.aclose()


async def test_check_and_migrate_refuse_another_baseline(fresh_postgres_dsn: str) -> None:
    archive = await _migrated(fresh_postgres_dsn)
    try:
        await _sql(fresh_postgres_dsn, "UPDATE pyrula.archive_schema SET baseline = 'other-1'")

        with pytest.raises(ArchiveSchemaMismatch, match="baseline 'other-1'.*recreate"):
            await archive.check()
        with pytest.raises(ArchiveSchemaMismatch, match="baseline 'other-1'"):
            await archive.migrate()
    finally:
        await archive.aclose()


async def test_migrate_refuses_tables_it_did_not_create(fresh_postgres_dsn: str) -> None:
    await _sql(fresh_postgres_dsn, "CREATE SCHEMA pyrula")
    await _sql(fresh_postgres_dsn, "CREATE TABLE pyrula.runs (id int)")
    archive = PostgresArchive(dsn=fresh_postgres_dsn)
    try:
        with pytest.raises(ArchiveSchemaMismatch, match="not a pyrula archive"):
            await archive.migrate()
    finally:
        await archive.aclose()


@pytest.mark.parametrize(
    ("version", "compat", "problem"),
    [
        (CURRENT_VERSION - 1, 0, "run `pyrula db migrate`"),  # this build is newer
        (CURRENT_VERSION + 1, CURRENT_VERSION + 1, "upgrade this worker"),  # contracting
        (CURRENT_VERSION + 1, CURRENT_VERSION, None),  # additive: older builds keep working
    ],
    ids=["older-schema", "newer-contracting", "newer-additive"],
)
async def test_check_by_version_and_compat(
    fresh_postgres_dsn: str, version: int, compat: int, problem: str | None
) -> None:
    archive = await _migrated(fresh_postgres_dsn)
    try:
        await _sql(fresh_postgres_dsn,
                   f"UPDATE pyrula.archive_schema SET version = {version}, compat = {compat}")
        if problem is None:
            assert (await archive.check()).version == version
        else:
            with pytest.raises(ArchiveSchemaMismatch, match=problem):
                await archive.check()
    finally:
        await archive.aclose()


async def test_the_archive_lives_in_the_schema_it_is_given(fresh_postgres_dsn: str) -> None:
    one, other = PostgresArchive(dsn=fresh_postgres_dsn), PostgresArchive(
        dsn=fresh_postgres_dsn, schema="archive_b"
    )
    try:
        await other.migrate()
        with pytest.raises(ArchiveSchemaMismatch):
            await one.check()
        assert (await other.check()).schema == "archive_b"
    finally:
        await one.aclose()
        await other.aclose()


async def test_a_workers_first_run_fails_with_the_mismatch(
    fresh_postgres_dsn: str, valkey_url: str, valkey_namespace: str
) -> None:
    store = ArchivingStore(
        live=ValkeyStore(url=valkey_url, namespace=valkey_namespace, shard_count=1),
        archive=PostgresArchive(dsn=fresh_postgres_dsn),
    )
    worker = WorkflowWorker(store=store, workflows=[noop], options=fast_options())
    try:
        with pytest.raises(ArchiveSchemaMismatch, match="pyrula db migrate"):
            await asyncio.wait_for(worker.run(), 30)
        assert worker.state == "starting"  # refused before any loop started
    finally:
        await store.aclose()


# --- the CLI --------------------------------------------------------------------------


def _invoke(*args: str, env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)


def test_cli_db_migrate_then_check(fresh_postgres_dsn: str, valkey_url: str) -> None:
    migrated = _invoke("db", "migrate", "--postgres-dsn", fresh_postgres_dsn)
    assert migrated.exit_code == 0, migrated.output
    assert f"migrated from version 0 to {CURRENT_VERSION}" in migrated.output

    # The DSN may come from PYRULA_POSTGRES_DSN.
    checked = _invoke("db", "check", "--store", valkey_url,
                      env={"PYRULA_POSTGRES_DSN": fresh_postgres_dsn})
    assert checked.exit_code == 0, checked.output
    assert "store ok" in checked.output
    assert f"archive ok: 127.0.0.1:5432/{fresh_postgres_dsn.rsplit('/', 1)[1]}" in (
        checked.output
    )


def test_cli_db_check_fails_on_a_missing_schema(fresh_postgres_dsn: str, valkey_url: str) -> None:
    result = _invoke("db", "check", "--store", valkey_url, "--postgres-dsn", fresh_postgres_dsn)

    assert result.exit_code == 1
    assert "archive schema mismatch" in result.output
    assert "pyrula db migrate" in result.output


def test_cli_db_check_fails_on_an_unreachable_archive(valkey_url: str) -> None:
    dsn = f"postgresql://postgres@127.0.0.1:5432/pyrula_test_absent_{uuid.uuid4().hex[:8]}"

    result = _invoke("db", "check", "--store", valkey_url, "--postgres-dsn", dsn)

    assert result.exit_code == 1
    assert "archive unreachable" in result.output
    assert "does not exist" in result.output


def test_cli_db_needs_a_dsn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYRULA_POSTGRES_DSN", raising=False)

    result = _invoke("db", "migrate")

    assert result.exit_code == 2
    assert "--postgres-dsn" in result.output
