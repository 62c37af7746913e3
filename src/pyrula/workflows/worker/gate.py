"""The suspect gate: a worker lets at most one suspect run into its code at a time.

A suspect is a run with a crash counted against it (within ``poison_retry_ttl_s``). Run
apart from the other suspects, it is the only suspect in user code should its process
die, and the supervisor charges that crash to it alone: a poison run is charged every
crash it causes, while a run that once shared a child with it is charged at most that once.
Ordinary runs are not held back. A claimed suspect waits here holding its lock (renewed as
any other's) and its slot; the one with the most crashes goes first, so a poison run is
found quickly, then the oldest waiter.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools

Attempt = tuple[str, int]  # (run id, token)


class SuspectGate:
    def __init__(self) -> None:
        self._holder: Attempt | None = None
        self._order = itertools.count()
        self._queue: list[tuple[int, int, Attempt]] = []
        self._waiting: dict[Attempt, asyncio.Future[None]] = {}

    @property
    def holder(self) -> Attempt | None:
        return self._holder

    async def enter(self, run_id: str, token: int, crashes: int) -> None:
        """Return once this attempt holds the gate. Cancelled, it waits no more (and holds
        nothing, unless it was handed the gate; ``leave`` releases that)."""
        key = (run_id, token)
        if self._holder is None and not self._waiting:
            self._holder = key
            return
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting[key] = turn
        heapq.heappush(self._queue, (-crashes, next(self._order), key))
        await turn

    def leave(self, run_id: str, token: int) -> None:
        """This attempt is done with the gate: release it, or stop waiting. Idempotent."""
        key = (run_id, token)
        turn = self._waiting.pop(key, None)
        if turn is not None:
            turn.cancel()
        if self._holder != key:
            return
        self._holder = None
        while self._queue:
            _, _, following = heapq.heappop(self._queue)
            turn = self._waiting.pop(following, None)
            if turn is not None and not turn.done():
                self._holder = following
                turn.set_result(None)
                return
