"""Fixtures of the chaos suite: the fleet tests' ``fleets`` (real fleet processes, reaped at
teardown) and ``client``, over the SQLite file in ``tmp_path`` unless a test picks a store;
``pg_cluster``, a PostgreSQL cluster of the test's own with a migrated archive schema, to
stop and start at will (skipped where none can be started)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from tests.fleet.conftest import client, fleets
from tests.pgcluster import PgCluster, skip_reason, start_pgcluster
from tests.tools import needs_tool

__all__ = ["client", "fleets", "pg_cluster"]


@pytest.fixture
def pg_cluster() -> Iterator[PgCluster]:
    needs_tool("a private PostgreSQL cluster (archive outage chaos tests)", skip_reason())
    cluster = start_pgcluster()
    try:
        from pyrula.workflows import PostgresArchive

        async def migrate() -> None:
            archive = PostgresArchive(dsn=cluster.dsn)
            try:
                await archive.migrate()
            finally:
                await archive.aclose()

        asyncio.run(migrate())
        yield cluster
    finally:
        cluster.destroy()
