"""Per-key concurrency limits and start rates in the memory store (KeyedLimits).

A queued run with keys waits in its key's line (``MemoryState.held``); each claim first
admits, line by line of the names it claims, the runs whose key has a free slot and a
token into their owners' queues (``admit``). A run holds its key's slot while it is
running or admitted (queued in its owner's queue): the count is taken from the runs
themselves, so every way a run stops running (ends, parks, is requeued) frees its slot.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pyrula.workflows.events import EventType, make_event
from pyrula.workflows.limits import LimitKeys, WorkflowLimits
from pyrula.workflows.records import RunStatus
from pyrula.workflows.stores.common import TokenBucket
from pyrula.workflows.stores.memory.state import MemoryState, RunRecord, held_line


class MemoryLimits:
    """The limits workers registered (``use_limits``) and each rate key's token bucket."""

    def __init__(self, state: MemoryState) -> None:
        self._state = state
        self._limits: dict[str, WorkflowLimits] = {}
        self._buckets: dict[tuple[str, str], TokenBucket] = {}

    def use_limits(self, limits: Mapping[str, WorkflowLimits]) -> None:
        """Enforce ``limits`` (workflow name -> its limits) from the next claim on."""
        with self._state.lock:
            self._limits.update(limits)

    def admit(self, names: Sequence[str], now: float) -> None:
        """Move the runs of ``names`` that their limits let start now out of their keys'
        lines into their owners' queues, each line in FIFO order until its head must
        wait. The caller holds the state's lock."""
        for (name, _), line in list(self._state.held.items()):
            if name not in names:
                continue
            while line:
                run = self._state.runs[line[0]]
                if not self.room(run, now):
                    break
                line.popleft()
                self._state.admit(run)

    def room(self, run: RunRecord, now: float, *, held_by_run: bool = False) -> bool:
        """Whether ``run`` may start now under its keys' limits, taking a rate token if
        so. ``held_by_run``: the run already counts among its key's (it is running)."""
        keys, limits = run.limit_keys, self._limits.get(run.name)
        if keys is None or limits is None:
            return True
        if keys.concurrency is not None and limits.max is not None:
            used = self._slots(run.name, keys.concurrency) - (1 if held_by_run else 0)
            if used >= limits.max:
                return False
        if keys.rate is not None and limits.per_second is not None:
            bucket = self._buckets.setdefault((run.name, keys.rate), TokenBucket(1.0, now))
            return bucket.take(limits.per_second, now)
        return True

    def _slots(self, name: str, key: str) -> int:
        """How many runs of ``name`` hold a slot of concurrency key ``key``."""
        return sum(
            1 for r in self._state.runs.values()
            if r.name == name and r.limit_keys is not None
            and r.limit_keys.concurrency == key and _holds_slot(r)
        )

    async def assign_limit_keys(
        self, run_id: str, token: int, keys: LimitKeys, *, now: float
    ) -> bool:
        """Record the keys the worker computed for the run it claimed without them; True
        if its limits let it run, else it goes back to its key's line (``run:requeued``
        reason ``limit``, lock released) and False. Atomic, fenced."""
        state = self._state
        with state.lock:
            run = state.fenced(run_id, token)
            run.limit_keys = keys
            # FIFO: runs already waiting in its key's line go first.
            if _line_of(state, run) == 0 and self.room(run, now, held_by_run=True):
                return True
            run.append([make_event(EventType.RUN_REQUEUED, now, reason="limit")], now)
            state.enqueue(run, now)
            return False


def _holds_slot(run: RunRecord) -> bool:
    if run.status is RunStatus.RUNNING:
        return True
    return run.status is RunStatus.QUEUED and not run.held and not run.suspect


def _line_of(state: MemoryState, run: RunRecord) -> int:
    """How many runs wait in the line ``run`` would wait in (0 without keys)."""
    line = held_line(run.limit_keys)
    return len(state.held.get((run.name, line), ())) if line is not None else 0
