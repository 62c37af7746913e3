"""Flow control of the memory store: each owner's limits, checked when a claim picks."""

from __future__ import annotations

import logging

from pyrula.workflows.records import FlowControl, RunStatus
from pyrula.workflows.stores.common import TokenBucket, validate_flow_control
from pyrula.workflows.stores.memory.state import MemoryState

logger = logging.getLogger(__name__)


class MemoryFlowControl:
    """The limits set per owner and, for a start rate, that owner's token bucket.

    Setting or deleting an owner's limits starts its bucket afresh.
    """

    def __init__(self, state: MemoryState) -> None:
        self._state = state
        self._limits: dict[str, FlowControl] = {}
        self._buckets: dict[str, TokenBucket] = {}

    async def aflow_control_set(
        self,
        owner: str,
        max_concurrent: int | None = None,
        max_starts_per_second: float | None = None,
    ) -> None:
        validate_flow_control(owner, max_concurrent, max_starts_per_second)
        with self._state.lock:
            self._limits[owner] = FlowControl(owner, max_concurrent, max_starts_per_second)
            self._buckets.pop(owner, None)

    async def aflow_control_get(self, owner: str) -> FlowControl | None:
        with self._state.lock:
            return self._limits.get(owner)

    async def aflow_control_delete(self, owner: str) -> bool:
        with self._state.lock:
            self._buckets.pop(owner, None)
            return self._limits.pop(owner, None) is not None

    def allows(self, owner: str, now: float) -> bool:
        """Whether ``owner`` may start one more run now (taking a token if it has a start
        rate). The caller holds the state's lock."""
        flow = self._limits.get(owner)
        if flow is None:
            return True
        if flow.max_concurrent is not None:
            running = sum(
                1 for r in self._state.runs.values()
                if r.owner == owner and r.status is RunStatus.RUNNING
            )
            if running >= flow.max_concurrent:
                return False
        if flow.max_starts_per_second is not None:
            bucket = self._buckets.setdefault(owner, TokenBucket(1.0, now))
            return bucket.take(flow.max_starts_per_second, now)
        return True
