"""Run control in the memory store: signal a run, nudge it, cancel it, wake a sleeping one
now."""

from __future__ import annotations

import logging
from typing import Any

from pyrula.workflows.errors import RunNotActive
from pyrula.workflows.events import CHILD_SIGNAL, INTERRUPT_SIGNAL, EventType, make_event
from pyrula.workflows.records import RunStatus
from pyrula.workflows.stores.memory.state import MemoryState

logger = logging.getLogger(__name__)


class MemoryControl:
    """What a client does to a run that is not its own attempt."""

    def __init__(self, state: MemoryState) -> None:
        self._state = state

    async def signal(self, run_id: str, name: str, payload: Any, *, now: float) -> None:
        with self._state.lock:
            run = self._state.get(run_id)
            # The live run of a continue_as_new chain takes over the chain's inbox.
            while run.status is RunStatus.CONTINUED and run.successor_id is not None:
                run = self._state.get(run.successor_id)
            if run.status.terminal:
                raise RunNotActive(f"run {run_id} has already ended ({run.status.value})")
            interrupt = name == INTERRUPT_SIGNAL
            type_ = EventType.INTERRUPT_RESUMED if interrupt else EventType.SIGNAL_RECEIVED
            event = make_event(type_, now, name=name, payload=payload)
            run.append([event], now)
            run.signal_seq[name] = len(run.journal)
            if run.status is RunStatus.WAITING and name in run.waiting_for:
                self._state.enqueue(run, now)

    async def nudge(self, run_id: str, *, now: float) -> None:
        with self._state.lock:
            run = self._state.runs.get(run_id)
            if run is None:
                return
            if run.status is RunStatus.RUNNING:
                run.nudged = True
            elif run.status is RunStatus.WAITING and CHILD_SIGNAL in run.waiting_for:
                self._state.enqueue(run, now)

    async def cancel(self, run_id: str, *, now: float) -> bool:
        with self._state.lock:
            run = self._state.get(run_id)
            if run.status.terminal:
                return False
            if run.status is RunStatus.RUNNING:
                # The attempt holding it learns on its next append or renew and ends it.
                run.cancel_requested = True
                run.updated_at = now
                return True
            run.append([make_event(EventType.RUN_CANCELLED, now)], now)
            self._state.end(run, RunStatus.CANCELLED, now)
            return True

    async def wake_run(self, run_id: str, *, now: float) -> bool:
        with self._state.lock:
            run = self._state.get(run_id)
            if run.status is not RunStatus.SLEEPING:
                return False
            run.append([make_event(EventType.RUN_WOKEN, now, reason="manual")], now)
            self._state.enqueue(run, now)
            return True
