"""How a run and its journal are laid out in the archive's tables: the run columns, the
one statement that upserts a batch of runs with their events, and a row read back as a
``RunInfo``. Pure: no connection here (postgres.py runs the statements)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import orjson

from pyrula.workflows.events import Event
from pyrula.workflows.records import RunInfo, RunStatus

RUN_COLUMNS = (
    "namespace, run_id, name, status, attempt, owner, params, result, error, interrupt, "
    "wake_at, waiting_for, created_at, updated_at, started_at, finished_at, "
    "idempotency_key, start_id, successor_id, event_count"
)

#: One statement: one round trip, atomic, and the runs' rows exist when the events'
#: foreign keys are checked (at the statement's end). ``{schema}`` is filled by the caller.
UPSERT_RUNS = (
    f"WITH archived AS (INSERT INTO {{schema}}.runs ({RUN_COLUMNS}) "
    "SELECT $1, r, n, s, a, o, p::json, res::json, err::json, intr::json, w, "
    "wf::json, c, u, st, f, ik, si, su, ec FROM unnest("
    "$2::text[], $3::text[], $4::text[], $5::int[], $6::text[], $7::text[], "
    "$8::text[], $9::text[], $10::text[], $11::float8[], $12::text[], "
    "$13::float8[], $14::float8[], $15::float8[], $16::float8[], $17::text[], "
    "$18::text[], $19::text[], $20::int[]) AS x(r, n, s, a, o, p, res, err, "
    "intr, w, wf, c, u, st, f, ik, si, su, ec) "
    "ON CONFLICT (namespace, run_id) DO UPDATE SET name = EXCLUDED.name, "
    "status = EXCLUDED.status, attempt = EXCLUDED.attempt, "
    "owner = EXCLUDED.owner, params = EXCLUDED.params, "
    "result = EXCLUDED.result, error = EXCLUDED.error, "
    "interrupt = EXCLUDED.interrupt, wake_at = EXCLUDED.wake_at, "
    "waiting_for = EXCLUDED.waiting_for, created_at = EXCLUDED.created_at, "
    "updated_at = EXCLUDED.updated_at, started_at = EXCLUDED.started_at, "
    "finished_at = EXCLUDED.finished_at, "
    "idempotency_key = EXCLUDED.idempotency_key, "
    "start_id = EXCLUDED.start_id, successor_id = EXCLUDED.successor_id, "
    "event_count = EXCLUDED.event_count, archived_at = now() RETURNING 1) "
    "INSERT INTO {schema}.events (namespace, run_id, seq, data) "
    "SELECT $1, r, q, d::json FROM unnest($21::text[], $22::int[], "
    "$23::text[]) AS x(r, q, d) ON CONFLICT (namespace, run_id, seq) "
    "DO UPDATE SET data = EXCLUDED.data"
)


def dumps(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()


def loads(data: str | None) -> Any:
    return None if data is None else orjson.loads(data)


def upsert_arguments(
    namespace: str, records: Iterable[tuple[RunInfo, Sequence[Event]]]
) -> tuple[int, list[Any]]:
    """The arguments of ``UPSERT_RUNS`` for ``records`` (a run given twice is written once,
    as given last), with how many runs they hold. Raises ValueError for a run that has not
    ended: only finished runs are archived."""
    by_id: dict[str, tuple[RunInfo, Sequence[Event]]] = {}
    for info, events in records:
        if not info.status.terminal:
            raise ValueError(
                f"run {info.run_id} is {info.status.value}: only finished runs are archived"
            )
        by_id[info.run_id] = (info, events)
    infos = [info for info, _ in by_id.values()]
    ev_runs: list[str] = []
    ev_seqs: list[int] = []
    ev_data: list[str] = []
    counts: list[int] = []
    for info, events in by_id.values():
        for position, event in enumerate(events, start=1):
            ev_runs.append(info.run_id)
            ev_seqs.append(int(event.get("seq", position)))
            ev_data.append(dumps(event))
        counts.append(len(events))
    return len(by_id), [
        namespace,
        [i.run_id for i in infos],
        [i.name for i in infos],
        [i.status.value for i in infos],
        [i.attempt for i in infos],
        [i.owner or "" for i in infos],
        [dumps(i.params) for i in infos],
        [dumps(i.result) for i in infos],
        [dumps(i.error) for i in infos],
        [dumps(i.interrupt) for i in infos],
        [i.wake_at for i in infos],
        [dumps(list(i.waiting_for)) for i in infos],
        [i.created_at for i in infos],
        [i.updated_at for i in infos],
        [i.started_at for i in infos],
        [i.finished_at for i in infos],
        [i.idempotency_key for i in infos],
        [i.start_id for i in infos],
        [i.successor_id for i in infos],
        counts,
        ev_runs,
        ev_seqs,
        ev_data,
    ]


def run_info(row: Any) -> RunInfo:
    """A ``runs`` row (columns ``RUN_COLUMNS``) as the RunInfo it was archived from."""
    waiting = loads(row["waiting_for"])
    return RunInfo(
        run_id=row["run_id"],
        name=row["name"],
        status=RunStatus(row["status"]),
        attempt=row["attempt"],
        params=loads(row["params"]),
        owner=row["owner"] or None,
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        started_at=row["started_at"],
        finished_at=row["finished_at"],
        result=loads(row["result"]),
        error=loads(row["error"]),
        wake_at=row["wake_at"],
        waiting_for=tuple(waiting or ()),
        interrupt=loads(row["interrupt"]),
        idempotency_key=row["idempotency_key"],
        start_id=row["start_id"],
        successor_id=row["successor_id"],
    )
