"""The Postgres archive: ArchivingStore (a live store whose finished runs are copied to
Postgres) and PostgresArchive. asyncpg is imported on first use only."""

from pyrula.workflows.stores.archive.archiver import ReconcileReport
from pyrula.workflows.stores.archive.pool import ArchiveError, ArchiveUnavailable
from pyrula.workflows.stores.archive.postgres import MigrateResult, PostgresArchive, SchemaStatus
from pyrula.workflows.stores.archive.schema import BASELINE, CURRENT_VERSION
from pyrula.workflows.stores.archive.store import (
    ArchivingStore,
    archived_if_configured,
    make_archiving_postgres,
)

__all__ = [
    "BASELINE",
    "CURRENT_VERSION",
    "ArchiveError",
    "ArchiveUnavailable",
    "ArchivingStore",
    "MigrateResult",
    "PostgresArchive",
    "ReconcileReport",
    "SchemaStatus",
    "archived_if_configured",
    "make_archiving_postgres",
]
