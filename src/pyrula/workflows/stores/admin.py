"""The administration facade: every synchronous store call, written once for all backends.

A backend implements each administration operation once, as a coroutine (``aping``,
``arecover_pending_runs``, ``aflow_control_*``, ``aschedule_*``). :class:`SyncAdmin` gives
it the synchronous twin users call from plain code (``store.schedule_create(...)``,
``store.flow_control_set(...)``, ``store.ping()``), each running the coroutine in the one
way the backend declares:

- ``sync_driven`` True: :func:`~pyrula.workflows._sync.drive` runs it on the calling
  thread with no event loop (every coroutine of the backend, the client's calls and
  ``wait_result`` included, has a blocking path that never suspends while
  :data:`~pyrula.workflows._sync.SYNC_DRIVE` is set: the Valkey store's sockets, the
  SQLite store's connection, the memory store's lock and condition). ``SyncWorkflowClient``
  reads the same flag;
- otherwise :func:`~pyrula.workflows._sync.run_sync` runs it on the process's background
  event loop while the calling thread waits.

The facade holds no state; a class that mixes it in must provide the coroutines above.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, ClassVar, Protocol, TypeVar

from pyrula.workflows._sync import drive, run_sync
from pyrula.workflows.records import FlowControl
from pyrula.workflows.schedules.schedule import Schedule

T = TypeVar("T")


class AsyncAdmin(Protocol):
    """The administration operations a backend implements, once each, as coroutines."""

    async def aping(self) -> None:
        """Raise StoreUnavailable unless the store answers."""
        ...

    async def arecover_pending_runs(self, name: str) -> int:
        """Requeue every run of ``name`` whose lock expired; returns how many."""
        ...

    async def aflow_control_set(
        self,
        owner: str,
        max_concurrent: int | None = None,
        max_starts_per_second: float | None = None,
    ) -> None: ...

    async def aflow_control_get(self, owner: str) -> FlowControl | None: ...

    async def aflow_control_delete(self, owner: str) -> bool: ...

    async def aschedule_create(
        self, schedule: Schedule, *, now: float | None = None
    ) -> Schedule:
        """Store ``schedule`` under its id, replacing any record with that id: enabled
        (a paused one is re-enabled), its ``next_run_at`` the first occurrence after
        ``now`` (default: the system clock). The last run is kept (for ``overlap``).
        Returns the schedule as stored."""
        ...

    async def aschedule_get(self, schedule_id: str) -> Schedule | None: ...

    async def aschedule_list(self) -> list[Schedule]:
        """Every schedule, by id."""
        ...

    async def aschedule_delete(self, schedule_id: str) -> bool:
        """Forget the schedule; False if there was none. Its runs are not touched."""
        ...


class SyncAdmin:
    """The synchronous twin of each :class:`AsyncAdmin` operation (mixed into a store)."""

    #: True when every coroutine of this backend (the run operations too) finishes without
    #: suspending while ``SYNC_DRIVE`` is set (run on the calling thread); False: on the
    #: background loop.
    sync_driven: ClassVar[bool] = False

    def _sync(self, coro: Coroutine[Any, Any, T]) -> T:
        return run_for(self, coro)

    def ping(self: _Admin) -> None:
        self._sync(self.aping())

    def recover_pending_runs(self: _Admin, name: str) -> int:
        return self._sync(self.arecover_pending_runs(name))

    def flow_control_set(
        self: _Admin,
        owner: str,
        max_concurrent: int | None = None,
        max_starts_per_second: float | None = None,
    ) -> None:
        self._sync(self.aflow_control_set(owner, max_concurrent, max_starts_per_second))

    def flow_control_get(self: _Admin, owner: str) -> FlowControl | None:
        return self._sync(self.aflow_control_get(owner))

    def flow_control_delete(self: _Admin, owner: str) -> bool:
        return self._sync(self.aflow_control_delete(owner))

    def schedule_create(
        self: _Admin, schedule: Schedule, *, now: float | None = None
    ) -> Schedule:
        return self._sync(self.aschedule_create(schedule, now=now))

    def schedule_get(self: _Admin, schedule_id: str) -> Schedule | None:
        return self._sync(self.aschedule_get(schedule_id))

    def schedule_list(self: _Admin) -> list[Schedule]:
        return self._sync(self.aschedule_list())

    def schedule_delete(self: _Admin, schedule_id: str) -> bool:
        return self._sync(self.aschedule_delete(schedule_id))


def run_for(store: object, coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` (a call into ``store``) to its end from synchronous code, the way the
    store declares: on this thread for a ``sync_driven`` SyncAdmin store (read from its
    class, so a store wrapping another does not inherit the answer of what it wraps), else
    on the background loop. What every synchronous facade uses: the admin twins, the
    ``SyncWorkflowClient`` and the schedule controls."""
    kind = type(store)
    if issubclass(kind, SyncAdmin) and kind.sync_driven:
        return drive(coro)
    return run_sync(coro)


class _Admin(AsyncAdmin, Protocol):
    def _sync(self, coro: Coroutine[Any, Any, T]) -> T: ...
