"""The Postgres archive's schema: one baseline and the migrations on top of it.

``BASELINE`` names the lineage of the schema. A database created from another baseline
(or by hand) is refused with ArchiveSchemaMismatch: recreate it and migrate again.

Each migration has a version (1, 2, ...) and is either additive (older builds keep
working on the migrated database) or contracting (older builds must refuse it). The
database records its ``version`` (the last migration applied) and ``compat`` (the version
of the last contracting migration applied). A build whose ``CURRENT_VERSION`` is

- below ``version`` but at least ``compat`` runs on it (additive migrations only since);
- below ``compat`` refuses it (a contracting migration it does not know about ran);
- above ``version`` refuses it until ``pyrula db migrate`` has run.

Statements are templates: ``{schema}`` is the Postgres schema (``pyrula`` by default).
JSON values are stored in ``json`` columns (kept as text, so a string holding ``\\u0000``,
which ``jsonb`` refuses, archives like any other).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pyrula.errors import ConfigurationError

BASELINE = "pyrula-archive-1"

_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    contracting: bool
    statements: tuple[str, ...]
    description: str


MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        version=1,
        contracting=True,  # the baseline itself: every build must know it
        description="finished runs, their journals, the reconcile cursor",
        statements=(
            """CREATE TABLE {schema}.runs (
                namespace text NOT NULL,
                run_id text NOT NULL,
                name text NOT NULL,
                status text NOT NULL,
                attempt integer NOT NULL,
                owner text NOT NULL DEFAULT '',
                params json,
                result json,
                error json,
                interrupt json,
                wake_at double precision,
                waiting_for json,
                created_at double precision NOT NULL,
                updated_at double precision NOT NULL,
                started_at double precision,
                finished_at double precision,
                idempotency_key text,
                start_id text,
                successor_id text,
                event_count integer NOT NULL,
                archived_at timestamptz NOT NULL DEFAULT now(),
                PRIMARY KEY (namespace, run_id)
            )""",
            """CREATE INDEX runs_listing
                ON {schema}.runs (namespace, created_at DESC, run_id DESC)""",
            """CREATE INDEX runs_by_name
                ON {schema}.runs (namespace, name, created_at DESC, run_id DESC)""",
            """CREATE INDEX runs_by_owner
                ON {schema}.runs (namespace, owner, created_at DESC, run_id DESC)""",
            """CREATE INDEX runs_finished ON {schema}.runs (namespace, finished_at)""",
            """CREATE TABLE {schema}.events (
                namespace text NOT NULL,
                run_id text NOT NULL,
                seq integer NOT NULL,
                data json NOT NULL,
                PRIMARY KEY (namespace, run_id, seq),
                FOREIGN KEY (namespace, run_id)
                    REFERENCES {schema}.runs (namespace, run_id) ON DELETE CASCADE
            )""",
            """CREATE TABLE {schema}.cursors (
                namespace text PRIMARY KEY,
                finished_at double precision NOT NULL,
                run_id text NOT NULL,
                updated_at timestamptz NOT NULL DEFAULT now()
            )""",
        ),
    ),
)

#: The schema version this build reads and writes.
CURRENT_VERSION = MIGRATIONS[-1].version

VERSION_TABLE = """CREATE TABLE {schema}.archive_schema (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    baseline text NOT NULL,
    version integer NOT NULL,
    compat integer NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
)"""


def check_schema_name(schema: str) -> str:
    if not isinstance(schema, str) or not _IDENTIFIER.match(schema):
        raise ConfigurationError(
            f"archive schema must be a lower-case SQL identifier (letters, digits, _), "
            f"got {schema!r}"
        )
    return schema


def compat_after(version: int, compat: int) -> int:
    """The compat floor once migrations up to ``version`` are applied on top of ``compat``."""
    for migration in MIGRATIONS:
        if migration.version <= version and migration.contracting:
            compat = max(compat, migration.version)
    return compat
