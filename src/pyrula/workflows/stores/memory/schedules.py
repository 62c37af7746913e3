"""Schedules in the memory store: their records, the due ones, and each advance."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from pyrula.workflows.schedules.schedule import Schedule
from pyrula.workflows.stores.common import records_run, schedule_from_store, schedule_to_store
from pyrula.workflows.stores.memory.state import MemoryState

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class ScheduleRecord:
    """A schedule as stored: its definition (``Schedule.definition()`` as JSON) and the
    state the schedule loop moves (paused, next run, last run)."""

    definition: str
    name: str
    paused: bool
    next_run_at: float
    last_run_id: str | None = None
    last_run_at: float | None = None

    def load(self) -> Schedule:
        return schedule_from_store(
            self.definition, paused=self.paused, next_run_at=self.next_run_at,
            last_run_id=self.last_run_id, last_run_at=self.last_run_at,
        )


class MemorySchedules:
    """The schedules by id."""

    def __init__(self, state: MemoryState) -> None:
        self._state = state
        self._records: dict[str, ScheduleRecord] = {}

    async def aschedule_create(
        self, schedule: Schedule, *, now: float | None = None
    ) -> Schedule:
        armed, definition = schedule_to_store(schedule, now)
        with self._state.lock:
            old = self._records.get(armed.schedule_id)
            record = ScheduleRecord(definition, armed.name, False, armed.next_run_at.timestamp())
            if old is not None:
                record.last_run_id, record.last_run_at = old.last_run_id, old.last_run_at
            self._records[armed.schedule_id] = record
            return record.load()

    async def aschedule_get(self, schedule_id: str) -> Schedule | None:
        with self._state.lock:
            record = self._records.get(schedule_id)
            return None if record is None else record.load()

    async def aschedule_list(self) -> list[Schedule]:
        with self._state.lock:
            return [self._records[i].load() for i in sorted(self._records)]

    async def aschedule_delete(self, schedule_id: str) -> bool:
        with self._state.lock:
            return self._records.pop(schedule_id, None) is not None

    async def schedules_due(
        self, names: Sequence[str], *, now: float, limit: int
    ) -> list[Schedule]:
        wanted = set(names)
        with self._state.lock:
            due = sorted(
                (r.next_run_at, i) for i, r in self._records.items()
                if not r.paused and r.next_run_at <= now and r.name in wanted
            )
            return [self._records[i].load() for _, i in due[: max(0, limit)]]

    async def schedule_advance(
        self,
        schedule_id: str,
        *,
        expected_next_run_at: float | None,
        next_run_at: float | None,
        run_id: str | None = None,
        run_at: float | None = None,
    ) -> bool:
        with self._state.lock:
            record = self._records.get(schedule_id)
            if record is None:
                return False
            if records_run(record.last_run_at, run_id, run_at):
                record.last_run_id, record.last_run_at = run_id, run_at
            if expected_next_run_at is None or next_run_at is None:
                return False
            if record.next_run_at != expected_next_run_at:
                return False
            record.next_run_at = next_run_at
            return True

    async def schedule_set_paused(
        self, schedule_id: str, paused: bool, *, next_run_at: float | None = None
    ) -> bool:
        with self._state.lock:
            record = self._records.get(schedule_id)
            if record is None:
                return False
            record.paused = bool(paused)
            if next_run_at is not None:
                record.next_run_at = next_run_at
            return True
