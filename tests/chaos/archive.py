"""What the chaos suite checks of the Postgres archive: every finished run is there exactly
once (one row, the table's key), with its whole journal as the live store holds it.

``check_archive`` reads a namespace's rows and events straight from Postgres (not through
the store, which would fall back to Valkey) and compares them with the journals the
verdict read from the live store. Its line: ``archived=N/M missing=0 mismatched=0
extra=0``. ``extra`` counts archived runs the load never saw acknowledged (a submit whose
reply was lost in a fault): not a violation. ``archiving_fleet`` starts the fleet these
scenarios archive from.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from tests.chaos.harness import APP
from tests.fleet.fleetprocs import QUICK, Fleet, Fleets, child_env
from tests.pgcluster import PgCluster

#: How many violations of each kind a check keeps, for a person to read.
DETAILS = 10


@dataclass(slots=True)
class ArchiveCheck:
    finished: int = 0
    archived: int = 0
    missing: int = 0
    mismatched: int = 0
    extra: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.archived == self.finished and not (self.missing or self.mismatched)

    def line(self) -> str:
        return (f"archived={self.archived}/{self.finished} missing={self.missing} "
                f"mismatched={self.mismatched} extra={self.extra}")


async def _fetch(dsn: str, namespace: str) -> tuple[dict[str, Any], dict[str, list[Any]]]:
    import asyncpg

    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        rows = await conn.fetch("SELECT run_id, status, event_count FROM pyrula.runs "
                                "WHERE namespace = $1", namespace)
        events = await conn.fetch("SELECT run_id, data FROM pyrula.events "
                                  "WHERE namespace = $1 ORDER BY run_id, seq", namespace)
    finally:
        await conn.close()
    journals: dict[str, list[Any]] = {}
    for row in events:
        journals.setdefault(row["run_id"], []).append(orjson.loads(row["data"]))
    return {row["run_id"]: row for row in rows}, journals


def archived_count(dsn: str, namespace: str, run_ids: Iterable[str]) -> int:
    """How many of ``run_ids`` the archive holds (0 while Postgres does not answer)."""
    import asyncpg

    async def count() -> int:
        conn = await asyncpg.connect(dsn, timeout=5)
        try:
            return int(await conn.fetchval(
                "SELECT count(*) FROM pyrula.runs WHERE namespace = $1 AND run_id = ANY($2)",
                namespace, list(run_ids)))
        finally:
            await conn.close()

    try:
        return asyncio.run(count())
    except (OSError, asyncpg.PostgresError, TimeoutError):
        return 0


def wait_archived(dsn: str, namespace: str, run_ids: Sequence[str], timeout: float) -> int:
    """Poll until the archive holds every run of ``run_ids``; how many it holds then."""
    deadline = time.monotonic() + timeout
    while True:
        have = archived_count(dsn, namespace, run_ids)
        if have >= len(run_ids) or time.monotonic() > deadline:
            return have
        time.sleep(0.2)  # a poll interval, not a synchronisation


def check_archive(dsn: str, namespace: str,
                  journals: Mapping[str, Sequence[Mapping[str, Any]] | None]) -> ArchiveCheck:
    """Compare the archive of ``namespace`` with the live ``journals`` (run id -> journal,
    as the verdict read them); runs without a terminal event are not expected there."""
    rows, archived = asyncio.run(_fetch(dsn, namespace))
    check = ArchiveCheck()

    def problem(text: str) -> None:
        if len(check.problems) < DETAILS:
            check.problems.append(text)

    for run_id, journal in journals.items():
        if not journal or not any(e["type"] in ("run:completed", "run:error", "run:cancelled",
                                                "run:continued") for e in journal):
            continue
        check.finished += 1
        row = rows.get(run_id)
        if row is None:
            check.missing += 1
            problem(f"missing: run {run_id} ended but is not archived")
            continue
        check.archived += 1
        events = archived.get(run_id, [])
        if row["event_count"] != len(journal) or events != [dict(e) for e in journal]:
            check.mismatched += 1
            problem(f"mismatched: run {run_id}: archived {len(events)} events "
                    f"(event_count {row['event_count']}), the live journal has {len(journal)}")
    check.extra = sum(1 for run_id in rows if run_id not in journals)
    return check


def archiving_fleet(fleets: Fleets, url: str, namespace: str, pg: PgCluster,
                    *extra: str) -> Fleet:
    """A fleet over Valkey archiving to ``pg``, as a deployment sets it up: the DSN in
    PYRULA_POSTGRES_DSN. The reconcile pass runs every second and takes runs ended over
    a second ago, so the test need not wait the default 60 s + 30 s."""
    env = child_env(PYRULA_POSTGRES_DSN=pg.dsn, PYRULA_ARCHIVE_RECONCILE_GRACE="1")
    fleet = fleets.start("-n", "2", "--namespace", namespace, "--reconcile-interval", "1",
                         "--orphan-scan-interval", "1", *QUICK, *extra, app=APP, store=url,
                         env=env)
    fleet.wait_ready(2, timeout=60)
    return fleet
