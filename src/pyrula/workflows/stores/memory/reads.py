"""Reads of the memory store: a run, its journal, runs by filter, a run's result, and the
ended runs an archiver copies."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from pyrula.workflows._sync import SYNC_DRIVE
from pyrula.workflows.events import Event
from pyrula.workflows.records import RunInfo, RunStatus
from pyrula.workflows.stores.memory.state import MemoryState

logger = logging.getLogger(__name__)


class MemoryReads:
    """Every read returns copies: nothing a caller does to them reaches the store."""

    def __init__(self, state: MemoryState) -> None:
        self._state = state

    async def get_run(self, run_id: str) -> RunInfo | None:
        with self._state.lock:
            run = self._state.runs.get(run_id)
            return None if run is None else run.info()

    async def read_events(self, run_id: str, after_seq: int = 0) -> list[Event]:
        with self._state.lock:
            return self._state.get(run_id).tail(after_seq)

    async def list_runs(
        self,
        *,
        name: str | None = None,
        status: RunStatus | None = None,
        owner: str | None = None,
        limit: int = 100,
        before: tuple[float, str] | None = None,
    ) -> list[RunInfo]:
        with self._state.lock:
            runs = sorted(
                self._state.runs.values(), key=lambda r: (r.created_at, r.run_id), reverse=True
            )
            out: list[RunInfo] = []
            for run in runs:
                if before is not None and (run.created_at, run.run_id) >= before:
                    continue
                if name is not None and run.name != name:
                    continue
                if status is not None and run.status != status:
                    continue
                if owner is not None and run.owner != owner:
                    continue
                out.append(run.info())
                if len(out) >= limit:
                    break
            return out

    async def wait_result(self, run_id: str, timeout: float | None) -> RunInfo:
        if SYNC_DRIVE.get():
            return self._wait_on_thread(run_id, timeout)
        return await self._state.waiters.wait(run_id, self._terminal_info, timeout)

    def _wait_on_thread(self, run_id: str, timeout: float | None) -> RunInfo:
        """``wait_result`` for a synchronous caller: block this thread (no event loop)
        until the run ends, releasing the lock while it waits."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._state.lock:
            while True:
                run = self._state.get(run_id)
                if run.status.terminal:
                    return run.info()
                wait = None if deadline is None else deadline - time.monotonic()
                if wait is not None and wait <= 0:
                    raise TimeoutError(f"run {run_id} did not end within {timeout} s")
                self._state.ended.wait(wait)

    async def _terminal_info(self, run_id: str) -> RunInfo | None:
        with self._state.lock:
            run = self._state.get(run_id)
            return run.info() if run.status.terminal else None

    async def ended_runs(
        self, *, after: tuple[float, str] | None, until: float, limit: int
    ) -> list[tuple[float, str]]:
        """(finished_at, run_id) of ended runs after the cursor ``after`` and at or before
        ``until``, oldest first, at most ``limit``."""
        with self._state.lock:
            ended = sorted(
                (run.finished_at, run.run_id) for run in self._state.runs.values()
                if run.status.terminal and run.finished_at is not None
                and run.finished_at <= until
                and (after is None or (run.finished_at, run.run_id) > after)
            )
        return ended[:limit]

    async def expire_finished(self, run_ids: Sequence[str], ttl: float) -> None:
        """A no-op: the memory store keeps finished runs for as long as it lives."""
        return None
