"""Worker membership in the memory store: who serves which workflows, and the queued runs
of workflows nobody serves (stranded)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from pyrula.workflows.records import RunStatus
from pyrula.workflows.stores.common import error_event
from pyrula.workflows.stores.memory.state import MemoryState

logger = logging.getLogger(__name__)


class MemoryMembership:
    """Each registered worker's expiry and workflow names."""

    def __init__(self, state: MemoryState) -> None:
        self._state = state
        self._workers: dict[str, tuple[float, tuple[str, ...]]] = {}
        self._served: set[str] = set()

    async def register_worker(
        self, worker_id: str, names: Sequence[str], *, now: float, ttl: float
    ) -> None:
        with self._state.lock:
            self._workers[worker_id] = (now + ttl, tuple(names))
            self._served.update(names)

    async def served_names(self) -> list[str]:
        with self._state.lock:
            return sorted(self._served)

    async def unregister_worker(self, worker_id: str) -> None:
        with self._state.lock:
            self._workers.pop(worker_id, None)

    async def stranded(self, *, now: float) -> list[str]:
        with self._state.lock:
            served = {n for expires, names in self._workers.values() if expires > now
                      for n in names}
            return sorted(
                name for name in set(self._state.queues) | set(self._state.suspects)
                if name not in served and self._state.queued(name)
            )

    async def fail_stranded(
        self, name: str, *, older_than: float, now: float, limit: int, error: dict[str, Any]
    ) -> list[str]:
        state = self._state
        failed: list[str] = []
        with state.lock:
            for run_id in state.queued(name):
                run = state.runs[run_id]
                if len(failed) >= limit or run.updated_at > older_than:
                    continue
                run.append([error_event(now, error)], now)
                state.end(run, RunStatus.FAILED, now, error=dict(error))
                failed.append(run_id)
        return failed
