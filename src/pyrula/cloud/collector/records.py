"""What the collector keeps: keys, events (each id once), runs, workers, queued submits."""

from __future__ import annotations

import hashlib
import secrets
import time
import uuid
from typing import Any

import orjson

from pyrula.cloud.collector.sql import Database, Sql

#: A run's status after an entry of each type (types not listed leave it as it was).
STATUS_AFTER = {
    "run:submitted": "queued", "run:requeued": "queued", "run:woken": "queued",
    "signal:received": "queued", "interrupt:resumed": "queued",
    "run:started": "running", "step:started": "running", "step:completed": "running",
    "step:failed": "running", "run:sleeping": "sleeping", "run:waiting": "waiting",
    "run:completed": "completed", "run:error": "failed", "run:cancelled": "cancelled",
    "run:continued": "continued",
}
#: A worker unseen this long is shown as gone (it heartbeats every 5 s).
WORKER_GONE_S = 20.0
#: A running run with no news this long is stuck.
STUCK_AFTER_S = 300.0
#: A submit taken and not acknowledged this long is offered again.
SUBMIT_RETAKE_S = 60.0


def key_hash(key: str) -> str:
    return hashlib.sha256(key.strip().encode()).hexdigest()


async def create_key(db: Database, environment: str) -> str:
    """A new key for ``environment``; only its hash is kept."""
    key = f"pyr_{environment}_{secrets.token_hex(16)}"
    async with db.transaction() as tx:
        await tx.execute("INSERT INTO cloud_keys (key_hash, environment, created_at) "
                         "VALUES (?, ?, ?)", key_hash(key), environment, time.time())
    return key


async def environment_of(db: Database, key: str) -> str | None:
    rows = await db.fetch("SELECT environment FROM cloud_keys WHERE key_hash = ?", key_hash(key))
    return str(rows[0]["environment"]) if rows else None


async def ingest(db: Database, environment: str, source: dict[str, Any],
                 events: list[dict[str, Any]]) -> int:
    """Apply a batch: each event id once; a run's row follows its highest ``seq``."""
    now = time.time()
    async with db.transaction() as tx:
        await _seen(tx, environment, source, now)
        latest: dict[str, dict[str, Any]] = {}
        applied = 0
        for e in events:
            rows = await tx.fetch(
                "INSERT INTO cloud_events (environment, event_id, run_id, workflow, seq, type, "
                "ts, worker_id, received_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT DO NOTHING RETURNING event_id",
                environment, str(e["id"]), str(e["run_id"]), str(e["workflow"]), int(e["seq"]),
                str(e["type"]), _float(e.get("ts")), source.get("worker_id"), now)
            applied += len(rows)
            if rows and e["type"] in STATUS_AFTER and (
                    e["run_id"] not in latest or e["seq"] > latest[e["run_id"]]["seq"]):
                latest[e["run_id"]] = e
        for e in latest.values():
            await _run_moved(tx, environment, source, e, now)
    return applied


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) else None


async def _run_moved(tx: Sql, environment: str, source: dict[str, Any], e: dict[str, Any],
                     now: float) -> None:
    await tx.execute(
        "INSERT INTO cloud_runs (environment, run_id, workflow, status, last_seq, updated_at, "
        "worker_id, fleet, error) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT (environment, run_id) DO UPDATE SET status = excluded.status, "
        "last_seq = excluded.last_seq, updated_at = excluded.updated_at, "
        "worker_id = excluded.worker_id, fleet = excluded.fleet, error = excluded.error "
        "WHERE excluded.last_seq > cloud_runs.last_seq",
        environment, str(e["run_id"]), str(e["workflow"]), STATUS_AFTER[e["type"]],
        int(e["seq"]), now, source.get("worker_id"), fleet_of(source), e.get("error"))


def fleet_of(source: dict[str, Any]) -> str:
    """The fleet a reporter belongs to; a worker outside a fleet is a fleet of its host."""
    return str(source.get("fleet") or f"{source.get('host') or '?'} ({source.get('kind')})")


async def _seen(tx: Sql, environment: str, source: dict[str, Any], now: float) -> None:
    if not source.get("worker_id"):
        return
    await tx.execute(
        "INSERT INTO cloud_workers (environment, worker_id, fleet, kind, host, pid, state, "
        "in_flight, runs_done, workflows, build, last_seen) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (environment, worker_id) "
        "DO UPDATE SET state = excluded.state, in_flight = excluded.in_flight, "
        "runs_done = excluded.runs_done, last_seen = excluded.last_seen",
        environment, str(source["worker_id"]), fleet_of(source), str(source.get("kind")),
        source.get("host"), _int(source.get("pid")), source.get("state"),
        _int(source.get("in_flight")), _int(source.get("runs_done")),
        ",".join(source.get("workflows") or []), source.get("build"), now)


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int) else None


async def workers(db: Database) -> list[dict[str, Any]]:
    rows = await db.fetch("SELECT * FROM cloud_workers ORDER BY environment, fleet, worker_id")
    now = time.time()
    for row in rows:
        row["live"] = now - float(row["last_seen"]) < WORKER_GONE_S
    return rows


async def fleets(db: Database) -> list[dict[str, Any]]:
    """Every fleet that reported, with its workers (children)."""
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for w in await workers(db):
        fleet = found.setdefault((w["environment"], w["fleet"]), {
            "fleet": w["fleet"], "environment": w["environment"], "workers": [],
            "live_workers": 0, "last_seen": 0.0})
        fleet["workers"].append(w)
        fleet["live_workers"] += int(w["live"])
        fleet["last_seen"] = max(fleet["last_seen"], float(w["last_seen"]))
    return list(found.values())


async def runs(db: Database, workflow: str | None = None, status: str | None = None,
               limit: int = 1000) -> list[dict[str, Any]]:
    sql, args = "SELECT * FROM cloud_runs WHERE 1 = 1", list[Any]()
    if workflow:
        sql, args = sql + " AND workflow = ?", [*args, workflow]
    if status:
        sql, args = sql + " AND status = ?", [*args, status]
    return await db.fetch(sql + " ORDER BY updated_at DESC LIMIT ?", *args, limit)


async def stuck_runs(db: Database) -> list[dict[str, Any]]:
    """Running runs with no news for STUCK_AFTER_S, or whose worker is gone."""
    gone = {(w["environment"], w["worker_id"]) for w in await workers(db) if not w["live"]}
    now = time.time()
    return [r for r in await runs(db, status="running", limit=10_000)
            if now - float(r["updated_at"]) > STUCK_AFTER_S
            or (r["environment"], r["worker_id"]) in gone]


async def queue_submit(db: Database, environment: str, workflow: str, params: Any) -> str:
    submit_id = uuid.uuid4().hex
    async with db.transaction() as tx:
        await tx.execute("INSERT INTO cloud_submits (submit_id, environment, workflow, params, "
                         "created_at) VALUES (?, ?, ?, ?, ?)", submit_id, environment,
                         workflow, orjson.dumps(params).decode(), time.time())
    return submit_id


async def take_submits(db: Database, environment: str, worker_id: str,
                       workflows: list[str], limit: int = 20) -> list[dict[str, Any]]:
    """Submits of ``environment`` for ``workflows``, not taken (or taken and not
    acknowledged for SUBMIT_RETAKE_S), now taken by ``worker_id``."""
    now = time.time()
    taken: list[dict[str, Any]] = []
    async with db.transaction() as tx:
        rows = await tx.fetch(
            "SELECT submit_id, workflow, params FROM cloud_submits WHERE environment = ? "
            "AND run_id IS NULL AND (taken_by IS NULL OR taken_at < ?) "
            "ORDER BY created_at LIMIT ?", environment, now - SUBMIT_RETAKE_S, limit)
        for row in rows:
            if row["workflow"] not in workflows:
                continue
            await tx.execute("UPDATE cloud_submits SET taken_by = ?, taken_at = ? "
                             "WHERE submit_id = ?", worker_id, now, row["submit_id"])
            taken.append({"submit_id": row["submit_id"], "workflow": row["workflow"],
                          "params": orjson.loads(row["params"])})
    return taken


async def ack_submits(db: Database, environment: str, acks: list[dict[str, Any]]) -> None:
    async with db.transaction() as tx:
        for ack in acks:
            await tx.execute("UPDATE cloud_submits SET run_id = ? WHERE submit_id = ? AND "
                             "environment = ?", str(ack["run_id"]), str(ack["submit_id"]),
                             environment)


async def submits(db: Database) -> list[dict[str, Any]]:
    return await db.fetch("SELECT * FROM cloud_submits ORDER BY created_at DESC LIMIT 200")
