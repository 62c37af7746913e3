"""The archive's configuration, refused at the constructor; and life without asyncpg."""

from __future__ import annotations

import asyncio
import importlib.util
import subprocess
import sys
from typing import Any

import pytest

from pyrula.workflows import (
    ArchiveSchemaMismatch,
    ArchivingStore,
    ConfigurationError,
    MemoryStore,
    PostgresArchive,
    make_archiving_postgres,
)
from pyrula.workflows.stores.archive import (
    ArchiveError,
    ArchiveUnavailable,
    archived_if_configured,
)
from pyrula.workflows.stores.archive.pool import redact
from tests.tools import needs_tool

DSN = "postgresql://pyrula:secret@db.internal:5433/archive"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"dsn": "mysql://x/y"}, "postgresql://"),
        ({"dsn": "db.internal:5432"}, "postgresql://"),
        ({"dsn": DSN, "schema": "Drop Table"}, "schema"),
        ({"dsn": DSN, "schema": "1abc"}, "schema"),
        ({"dsn": DSN, "max_connections": 1}, "max_connections"),
        ({"dsn": DSN, "connect_timeout": 0}, "connect_timeout"),
        ({"dsn": DSN, "command_timeout": "5s"}, "command_timeout"),
    ],
)
def test_bad_archive_options_are_refused(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        PostgresArchive(**kwargs)


def test_a_refused_dsn_is_named_without_its_password() -> None:
    with pytest.raises(ConfigurationError) as refused:
        PostgresArchive(dsn="mysql://pyrula:secret@db/x")
    assert "secret" not in str(refused.value)
    assert redact(DSN) == "postgresql://pyrula:***@db.internal:5433/archive"


def test_the_dsn_comes_from_pyrula_postgres_dsn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYRULA_POSTGRES_DSN", raising=False)
    with pytest.raises(ConfigurationError, match="PYRULA_POSTGRES_DSN"):
        PostgresArchive()
    monkeypatch.setenv("PYRULA_POSTGRES_DSN", DSN)
    archive = PostgresArchive()
    assert archive.dsn == DSN
    assert archive.where() == "db.internal:5433/archive"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"live_ttl_after_archive": -1}, "live_ttl_after_archive"),
        ({"live_ttl_after_archive": float("inf")}, "live_ttl_after_archive"),
        ({"live_ttl_after_archive": True}, "live_ttl_after_archive"),
        ({"reconcile_grace": -0.5}, "reconcile_grace"),
        ({"reconcile_batch": 0}, "reconcile_batch"),
    ],
)
def test_bad_archiving_store_options_are_refused(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        ArchivingStore(live=MemoryStore(), archive=PostgresArchive(dsn=DSN), **kwargs)


def test_an_archiving_store_needs_a_live_store_and_a_postgres_archive() -> None:
    archive = PostgresArchive(dsn=DSN)
    with pytest.raises(ConfigurationError, match="archive must be a PostgresArchive"):
        ArchivingStore(live=MemoryStore(), archive=MemoryStore())  # type: ignore[arg-type]
    inner = ArchivingStore(live=MemoryStore(), archive=archive)
    with pytest.raises(ConfigurationError, match="live store"):
        ArchivingStore(live=inner, archive=archive)


def test_the_archiving_store_defaults_and_the_live_stores_extras() -> None:
    store = make_archiving_postgres(dsn=DSN, valkey_url="redis://127.0.0.1:1",
                                    namespace="staging", shard_count=8)
    assert store.live_ttl_after_archive == 300
    assert store.namespace == "staging"
    assert store.shard_count == 8  # the live store's attribute
    assert ArchivingStore(live=MemoryStore(), archive=PostgresArchive(dsn=DSN)).namespace == (
        "default"
    )
    with pytest.raises(AttributeError):
        _ = store.no_such_attribute


def test_pyrula_postgres_dsn_wraps_the_store_the_cli_opens(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    live = MemoryStore()
    monkeypatch.delenv("PYRULA_POSTGRES_DSN", raising=False)
    assert archived_if_configured(live) is live
    monkeypatch.setenv("PYRULA_POSTGRES_DSN", DSN)
    wrapped = archived_if_configured(live)
    assert isinstance(wrapped, ArchivingStore)
    assert wrapped.live is live and wrapped.archive.dsn == DSN
    assert archived_if_configured(wrapped) is wrapped


def test_pyrula_archive_reconcile_grace_sets_the_grace_of_that_store(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PYRULA_ARCHIVE_RECONCILE_GRACE", raising=False)
    assert archived_if_configured(MemoryStore(), DSN).reconcile_grace == 30.0
    monkeypatch.setenv("PYRULA_ARCHIVE_RECONCILE_GRACE", "2.5")
    assert archived_if_configured(MemoryStore(), DSN).reconcile_grace == 2.5
    for bad in ("5s", "-1"):
        monkeypatch.setenv("PYRULA_ARCHIVE_RECONCILE_GRACE", bad)
        with pytest.raises(ConfigurationError, match="PYRULA_ARCHIVE_RECONCILE_GRACE"):
            archived_if_configured(MemoryStore(), DSN)


def test_pyrula_workflows_imports_without_asyncpg() -> None:
    code = (
        "import sys; sys.modules['asyncpg'] = None\n"
        "from pyrula.workflows import ArchivingStore, PostgresArchive, make_archiving_postgres\n"
        "print('imported')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "imported"


def test_without_asyncpg_the_first_use_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "asyncpg", None)  # import asyncpg raises ImportError
    archive = PostgresArchive(dsn=DSN)
    with pytest.raises(ConfigurationError, match=r'pip install "pyrula\[workflows,postgres\]"'):
        asyncio.run(archive.check())


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        ("InternalClientError", ArchiveUnavailable),  # a connection the server ended, pooled
        ("ConnectionDoesNotExistError", ArchiveUnavailable),
        ("AdminShutdownError", ArchiveUnavailable),
        ("UndefinedTableError", ArchiveSchemaMismatch),
        ("DeadlockDetectedError", ArchiveError),
    ],
)
def test_database_errors_are_translated_and_a_broken_connection_is_dropped(
    error: str, expected: type[Exception]
) -> None:
    needs_tool("asyncpg (Postgres archive error translation)",
               None if importlib.util.find_spec("asyncpg") else
               "asyncpg is not installed (it is in the postgres extra)")
    import asyncpg

    class Connection:
        terminated = False

        def terminate(self) -> None:
            self.terminated = True

    conn = Connection()
    with pytest.raises(expected), PostgresArchive(dsn=DSN)._pools.translated(conn):
        raise getattr(asyncpg.exceptions, error)("boom")
    assert conn.terminated == (expected is ArchiveUnavailable)
