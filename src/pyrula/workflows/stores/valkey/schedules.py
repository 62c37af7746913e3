"""Schedules: their records (one hash per namespace, scripted), the due ones, their
advance after a run is submitted, pausing."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from pyrula.workflows.schedules.schedule import Schedule
from pyrula.workflows.stores.common import schedule_from_store, schedule_to_store
from pyrula.workflows.stores.valkey.codec import seconds
from pyrula.workflows.stores.valkey.connection import Connection

logger = logging.getLogger(__name__)


def _schedule(row: Sequence[Any]) -> Schedule:
    _, definition, paused, next_run_at, last_run_id, last_run_at = row
    return schedule_from_store(
        definition, paused=paused == "1", next_run_at=float(next_run_at),
        last_run_id=str(last_run_id) or None,
        last_run_at=float(last_run_at) if last_run_at != "" else None,
    )


class Schedules:
    """The schedules of one namespace."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection

    async def _op(self, *args: Any) -> Any:
        return await self.connection.op(self.connection.keys.schedules, *args)

    async def aschedule_create(
        self, schedule: Schedule, *, now: float | None = None
    ) -> Schedule:
        armed, definition = schedule_to_store(schedule, now)
        row = await self._op("schedule_put", armed.schedule_id, armed.name, definition,
                             seconds(armed.next_run_at.timestamp()))
        return _schedule(row)

    async def aschedule_get(self, schedule_id: str) -> Schedule | None:
        rows = await self._op("schedule_get", schedule_id)
        return _schedule(rows[0]) if rows else None

    async def aschedule_list(self) -> list[Schedule]:
        rows = await self._op("schedule_get")
        return [_schedule(row) for row in rows]

    async def aschedule_delete(self, schedule_id: str) -> bool:
        return bool(int(await self._op("schedule_delete", schedule_id)))

    async def schedules_due(
        self, names: Sequence[str], *, now: float, limit: int
    ) -> list[Schedule]:
        if not names or limit <= 0:
            return []
        rows = await self._op("schedule_due", now, limit, *names)
        due = sorted((_schedule(row) for row in rows),
                     key=lambda sc: (sc.next_run_at, sc.schedule_id))
        return due[:limit]

    async def schedule_advance(
        self,
        schedule_id: str,
        *,
        expected_next_run_at: float | None,
        next_run_at: float | None,
        run_id: str | None = None,
        run_at: float | None = None,
    ) -> bool:
        moved = await self._op(
            "schedule_advance", schedule_id,
            "" if expected_next_run_at is None else seconds(expected_next_run_at),
            "" if next_run_at is None else seconds(next_run_at),
            run_id or "", "" if run_id is None or run_at is None else repr(float(run_at)),
        )
        return bool(int(moved))

    async def schedule_set_paused(
        self, schedule_id: str, paused: bool, *, next_run_at: float | None = None
    ) -> bool:
        found = await self._op(
            "schedule_pause", schedule_id, "1" if paused else "0",
            "" if next_run_at is None else seconds(next_run_at),
        )
        return bool(int(found))
