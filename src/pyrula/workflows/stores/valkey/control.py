"""Run control from outside the run: deliver a signal, nudge a parent, cancel, wake a
parked run now."""

from __future__ import annotations

import logging
from typing import Any

from pyrula.errors import RunNotActive, WorkflowNotFound
from pyrula.workflows.events import CHILD_SIGNAL, INTERRUPT_SIGNAL, EventType, make_event
from pyrula.workflows.stores.valkey.codec import dumps
from pyrula.workflows.stores.valkey.connection import Connection
from pyrula.workflows.stores.valkey.doorbell import Doorbell

logger = logging.getLogger(__name__)


class Control:
    """Signals, nudges, cancels and wakes of runs; a run queued by one rings its shard."""

    def __init__(self, connection: Connection, doorbell: Doorbell) -> None:
        self.connection = connection
        self.doorbell = doorbell

    async def _op(self, run_id: str, *args: Any) -> str:
        """One control script call on the run's shard; NOTFOUND raises WorkflowNotFound."""
        base = self.connection.keys.base_of_run(run_id)
        if base is None:
            raise WorkflowNotFound(f"no run with id {run_id!r}")
        answer = str(await self.connection.op(base, *args))
        if answer == "NOTFOUND":
            raise WorkflowNotFound(f"no run with id {run_id!r}")
        return answer

    async def signal(self, run_id: str, name: str, payload: Any, *, now: float) -> None:
        interrupt = name == INTERRUPT_SIGNAL
        type_ = EventType.INTERRUPT_RESUMED if interrupt else EventType.SIGNAL_RECEIVED
        event = make_event(type_, now, name=name, payload=payload)
        answer = await self._op(run_id, "signal", run_id, now, name, dumps(event))
        if answer.startswith("ENDED"):
            raise RunNotActive(f"run {run_id} has already ended ({answer.split(' ', 1)[1]})")
        if answer == "QUEUED":
            await self.doorbell.ring_run(run_id, now)

    async def nudge(self, run_id: str, *, now: float) -> None:
        base = self.connection.keys.base_of_run(run_id)
        if base is None:
            return  # no run of this store: nobody to tell
        answer = await self.connection.op(base, "nudge", run_id, now, CHILD_SIGNAL)
        if answer == "QUEUED":
            await self.doorbell.ring_run(run_id, now)

    async def cancel(self, run_id: str, *, now: float) -> bool:
        answer = await self._op(run_id, "cancel", run_id, now, self.connection.completed_ttl)
        return answer in ("CANCELLED", "REQUESTED")

    async def wake_run(self, run_id: str, *, now: float) -> bool:
        answer = await self._op(run_id, "wake_run", run_id, now)
        if answer == "WOKEN":
            await self.doorbell.ring_run(run_id, now)
            return True
        return False
